import { BrokerException } from '../errors/broker.exception';

export enum TokenStoreErrorCode {
  Unavailable = 'store_unavailable',
}

/** The token service then degrades to per-replica behaviour. */
export class TokenStoreException extends BrokerException<TokenStoreErrorCode> {}

import { BrokerException } from '../errors/broker.exception';

export enum TokenStoreErrorCode {
  /** The shared store did not answer in time or is disconnected. */
  Unavailable = 'store_unavailable',
}

/** The shared token store failed; the token service degrades to per-replica behaviour. */
export class TokenStoreException extends BrokerException<TokenStoreErrorCode> {}

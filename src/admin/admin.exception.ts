import { BrokerException } from '../errors/broker.exception';

/** Why an admin route could not do what it was asked (problem codes, see `http/problem.ts`). */
export enum AdminErrorCode {
  /**
   * 503: the shared store (Redis) does not answer, and a fleet-wide action needs it: a refresh
   * or revoke done by this replica alone would leave the others serving the old token.
   */
  StoreUnavailable = 'admin_store_unavailable',
  /** 502: the forced refresh asked the provider, which did not grant a token. */
  RefreshFailed = 'admin_refresh_failed',
}

export class AdminException extends BrokerException<AdminErrorCode> {}

import { BrokerException } from '../errors/broker.exception';

export enum CallerAuthErrorCode {
  /** No credential, a malformed one, or one that does not verify. */
  Unauthenticated = 'unauthenticated',
  /** A valid caller asking for a client it may not use. */
  Forbidden = 'forbidden',
  /** The credential cannot be checked right now (the cluster's signing keys are unreachable). */
  Unavailable = 'caller_auth_unavailable',
}

/** A caller that cannot be admitted: unauthenticated, not granted the client, or not checkable now. */
export class CallerAuthException extends BrokerException<CallerAuthErrorCode> {}

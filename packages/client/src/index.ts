export {
  createBrokerClient,
  type BrokerClient,
  type BrokerClientOptions,
  type BrokerToken,
  type CreateOrderOptions,
  type GetTokenOptions,
  type OrderResult,
} from './client';
export type { CredentialSource } from './credentials';
export {
  BrokerAuthError,
  BrokerError,
  type BrokerErrorCode,
  BrokerRequestError,
  BrokerUnavailableError,
  OrderOutcomeUnknownError,
} from './errors';

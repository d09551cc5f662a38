import { CALLER_SCOPES } from '../config/caller-auth.schema';
import type { Caller, CallerAuthenticator } from './caller';

const ANONYMOUS: Caller = {
  name: 'anonymous',
  clients: '*',
  scopes: new Set(CALLER_SCOPES),
};

/** Mode `none`: development only. */
export class AllowAllAuthenticator implements CallerAuthenticator {
  authenticate(): Caller {
    return ANONYMOUS;
  }
}

import type { Caller, CallerAuthenticator } from './caller';

const ANONYMOUS: Caller = { name: 'anonymous', clients: '*' };

/** Caller authentication mode `none`: everyone is allowed everything. Development only. */
export class AllowAllAuthenticator implements CallerAuthenticator {
  authenticate(): Caller {
    return ANONYMOUS;
  }
}

import { type ClientState, replicaReady, servable } from './client-readiness';

const ok = (client: string): ClientState => ({ client, hasToken: true, everObtained: true });
const never = (client: string): ClientState => ({
  client,
  hasToken: false,
  everObtained: false,
  permanentError: { code: 'credentials_rejected' },
});

describe('client readiness', () => {
  it('a client is servable once it obtained a token, through a later provider outage too', () => {
    expect(servable(ok('a'))).toBe(true);
    // The token expired during a provider outage: still this replica's to serve when it is back.
    expect(servable({ ...ok('a'), hasToken: false })).toBe(true);
    // Credentials refused while a valid token is held: served until it expires.
    expect(servable({ ...ok('a'), permanentError: { code: 'credentials_rejected' } })).toBe(true);
    expect(servable({ ...ok('a'), hasToken: false, permanentError: {} })).toBe(false);
    expect(servable({ ...ok('a'), lifetimeError: 'too short' })).toBe(false);
    expect(servable(never('a'))).toBe(false);
  });

  it('without required clients, one servable client makes the replica ready', () => {
    expect(replicaReady([ok('a'), never('b')], [])).toBe(true);
    expect(replicaReady([never('a'), never('b')], [])).toBe(false);
    expect(replicaReady([], [])).toBe(false);
  });

  it('with required clients, each of them must be servable, and only them', () => {
    expect(replicaReady([ok('a'), never('b')], ['a'])).toBe(true);
    expect(replicaReady([ok('a'), never('b')], ['a', 'b'])).toBe(false);
    expect(replicaReady([ok('a')], ['missing'])).toBe(false);
  });
});

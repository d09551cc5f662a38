import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigException } from './config.exception';
import { loadConfig } from './config.loader';

const HASH = 'ab'.repeat(32);
const SUBJECT = 'system:serviceaccount:shop:checkout';
const clients = [
  { id: 'acme-prod', authUrl: 'https://a', baseUrl: 'https://a', credentials: { file: '/a' } },
  {
    id: 'flexpay-prod',
    authUrl: 'https://a',
    baseUrl: 'https://a',
    ordersPath: '/api/flexpay/v1/orders',
    credentials: { file: '/b' },
  },
];

function configFile(content: unknown): string {
  const file = join(mkdtempSync(join(tmpdir(), 'tb-config-')), 'broker.json');
  writeFileSync(file, JSON.stringify(content));
  return file;
}

function problems(content: unknown): string[] {
  try {
    loadConfig({ BROKER_CONFIG_FILE: configFile(content) });
  } catch (err) {
    if (err instanceof ConfigException) return err.problems.map((p) => p.replace(/^.*?: /, ''));
    throw err;
  }
  throw new Error('expected a ConfigException');
}

const apiKeys = (grant: Record<string, unknown>) => ({
  clients,
  callerAuth: {
    mode: 'api-key',
    apiKeys: [{ name: 'checkout', sha256: HASH, clients: ['acme-prod'], ...grant }],
  },
});

const subjects = (grant: unknown) => ({
  clients,
  callerAuth: {
    mode: 'kubernetes',
    kubernetes: {
      jwksUrl: 'https://kubernetes.default.svc/openid/v1/jwks',
      issuer: 'https://kubernetes.default.svc.cluster.local',
      subjects: { [SUBJECT]: grant },
    },
  },
});

describe('clients[].forward.allow', () => {
  it("opens by default what the provider documents: POST on the client's own orders path, marketing reads", () => {
    const cfg = loadConfig({ BROKER_CONFIG_FILE: configFile(apiKeys({})) });
    expect(cfg.clients.map((c) => c.forward.allow)).toEqual([
      [
        { methods: ['POST'], path: '/api/checkout/v1/orders' },
        { methods: ['GET', 'HEAD'], prefix: '/api/marketing/v1/' },
      ],
      [
        { methods: ['POST'], path: '/api/flexpay/v1/orders' },
        { methods: ['GET', 'HEAD'], prefix: '/api/marketing/v1/' },
      ],
    ]);
  });

  it('keeps a configured list as it is, exact paths included', () => {
    const allow = [{ methods: ['DELETE'], path: '/api/checkout/v1/orders/o-1' }];
    const cfg = loadConfig({
      BROKER_CONFIG_FILE: configFile({
        ...apiKeys({}),
        clients: [{ ...clients[0], forward: { allow } }],
      }),
    });
    expect(cfg.clients[0].forward.allow).toEqual(allow);
  });
});

describe('a grant’s forwardAllow (API keys and service accounts)', () => {
  const rules = [{ methods: ['GET'], prefix: '/api/marketing/v1/' }];

  it('is read on an API key and on a subject grant, absent by default', () => {
    const keyed = loadConfig({ BROKER_CONFIG_FILE: configFile(apiKeys({ forwardAllow: rules })) });
    expect(keyed.callerAuth.apiKeys?.[0].forwardAllow).toEqual(rules);
    const bare = loadConfig({ BROKER_CONFIG_FILE: configFile(apiKeys({})) });
    expect(bare.callerAuth.apiKeys?.[0].forwardAllow).toBeUndefined();
    const granted = loadConfig({
      BROKER_CONFIG_FILE: configFile(
        subjects({ clients: ['acme-prod'], scopes: ['forward'], forwardAllow: rules }),
      ),
    });
    expect(granted.callerAuth.kubernetes.subjects[SUBJECT].forwardAllow).toEqual(rules);
  });

  it.each([
    [
      'an empty list',
      { forwardAllow: [] },
      'callerAuth.apiKeys[0].forwardAllow: list at least one rule, or take scope "forward" away from this caller',
    ],
    [
      'a grant without scope forward',
      { scopes: ['token'], forwardAllow: rules },
      'callerAuth.apiKeys[0].forwardAllow: only with scope "forward": it narrows what may be forwarded',
    ],
    [
      'a rule with both prefix and path',
      { forwardAllow: [{ prefix: '/api/', path: '/api/x' }] },
      'callerAuth.apiKeys[0].forwardAllow[0]: set exactly one of prefix (a path and everything under it) or path (that path only)',
    ],
    [
      'an unknown method',
      { forwardAllow: [{ methods: ['TRACE'], prefix: '/api/' }] },
      'callerAuth.apiKeys[0].forwardAllow[0].methods[0]',
    ],
  ])('refuses %s on an API key, naming the setting', (_name, grant, expected) => {
    expect(problems(apiKeys(grant)).join('\n')).toContain(expected);
  });

  it('refuses a bad rule on a subject grant, naming the setting and never the value', () => {
    const secretish = '/api/..%2fsk_live_PASTED_SECRET/';
    const found = problems(
      subjects({ clients: ['acme-prod'], forwardAllow: [{ methods: ['GET'], prefix: secretish }] }),
    ).join('\n');
    expect(found).toContain(`callerAuth.kubernetes.subjects.${SUBJECT}.forwardAllow[0].prefix`);
    expect(found).toContain('must be an absolute path of plain segments ending in "/"');
    expect(found).not.toContain('sk_live_PASTED_SECRET');
  });
});

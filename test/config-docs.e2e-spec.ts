import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { parse as parseYaml } from 'yaml';
import {
  CHART_SCHEMA_FILE,
  CONFIG_DOCS_FILE,
  formatChartSchema,
  renderChartSchema,
  renderConfigDocs,
} from '../scripts/config-docs';
import { clientSchema } from '../src/config/client.schema';
import { brokerConfigSchema } from '../src/config/config.schema';
import { envSettings, settingFields } from '../src/config/setting-meta';
import { repoRoot } from './support/repo-root';

const root = repoRoot();

describe('docs/configuration.md', () => {
  it('is what `npm run docs:config` generates from the config schema today', () => {
    const committed = readFileSync(join(root, CONFIG_DOCS_FILE), 'utf8');
    const generated = renderConfigDocs();
    // The failure names the command that fixes it; Jest's diff shows the rows that drifted.
    if (committed !== generated) {
      expect({ file: CONFIG_DOCS_FILE, hint: 'run `npm run docs:config`', committed }).toEqual({
        file: CONFIG_DOCS_FILE,
        hint: 'run `npm run docs:config`',
        committed: generated,
      });
    }
  });

  it('lists every environment variable the loader reads', () => {
    const docs = readFileSync(join(root, CONFIG_DOCS_FILE), 'utf8');
    const names = envSettings(settingFields(brokerConfigSchema)).map((s) => s.env);
    expect(names.length).toBeGreaterThan(100);
    expect(names.filter((name) => !docs.includes(`\`${name}\``))).toEqual([]);
  });
});

describe("the Helm chart's values.schema.json", () => {
  const committedText = readFileSync(join(root, CHART_SCHEMA_FILE), 'utf8');
  const committed = JSON.parse(committedText) as Record<string, unknown>;

  it('holds in `config` what `npm run docs:config` generates from the config schema today', () => {
    const generated = renderChartSchema(committed);
    // Only the generated sections can differ: everything else is copied from the file itself.
    if (JSON.stringify(generated) !== JSON.stringify(committed)) {
      expect({ file: CHART_SCHEMA_FILE, hint: 'run `npm run docs:config`', committed }).toEqual({
        file: CHART_SCHEMA_FILE,
        hint: 'run `npm run docs:config`',
        committed: generated,
      });
    }
  });

  it('is written as the script writes it (Prettier), so a rerun changes nothing', async () => {
    expect(await formatChartSchema(committed)).toBe(committedText);
  });

  it('drops a setting the broker no longer has: the generated part is compared whole', () => {
    type Sections = { properties: { config: { properties: Record<string, JsonObject> } } };
    type JsonObject = { properties: Record<string, unknown> };
    const stale = structuredClone(committed) as Sections;
    expect(Object.keys(stale.properties.config.properties.token.properties)).toContain(
      'minRefreshIntervalMs',
    );
    stale.properties.config.properties.token.properties.retiredSetting = { type: 'integer' };
    expect(renderChartSchema(stale)).toEqual(committed);
  });
});

describe("README.md's client examples", () => {
  /** Each `yaml` block of the README that is a whole `clients:` list. */
  const blocks = [
    ...readFileSync(join(root, 'README.md'), 'utf8').matchAll(/```yaml\n([\s\S]*?)```/g),
  ]
    .map((m) => m[1])
    .filter((block) => block.startsWith('clients:'));

  it('load as the broker reads clients, one example per token request profile', () => {
    const clients = blocks.flatMap((b) => (parseYaml(b) as { clients: unknown[] }).clients);
    const profiles = new Set<string>();
    for (const client of clients) {
      const parsed = clientSchema.safeParse(client);
      expect({ client, issues: parsed.error?.issues ?? [] }).toEqual({ client, issues: [] });
      const request = parsed.data?.tokenRequest;
      if (request) profiles.add(`${request.grant} ${request.auth}`);
    }
    expect([...profiles].sort()).toEqual([
      'provider-query client_secret_basic',
      'rfc6749 client_secret_basic',
      'rfc6749 client_secret_post',
      'rfc6749 private_key_jwt',
      'rfc6749 tls_client_auth',
    ]);
  });
});

describe('relative links in README.md and docs/', () => {
  const files = [
    'README.md',
    ...readdirSync(join(root, 'docs'))
      .filter((f) => f.endsWith('.md'))
      .map((f) => `docs/${f}`),
  ];

  it.each(files)('%s links only to files that exist', (file) => {
    const text = readFileSync(join(root, file), 'utf8');
    const broken = [...text.matchAll(/\]\(([^)\s]+)\)/g)]
      .map((m) => m[1])
      .filter((target) => !/^[a-z][a-z0-9+.-]*:/i.test(target) && !target.startsWith('#'))
      .filter((target) => !existsSync(resolve(dirname(join(root, file)), target.split('#')[0])));
    expect(broken).toEqual([]);
  });
});

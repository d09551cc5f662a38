import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as undici from 'undici';
import { bundleForNode } from '../../test/support/node-bundle';
import { Agent, failedToConnect, translateTransportError } from './provider-http';
import { ProviderErrorCode } from './provider.exception';

const ROOT = join(__dirname, '..', '..');

describe('provider-http: undici without its index', () => {
  it("is the index's own Agent and error classes", () => {
    expect(Agent).toBe(undici.Agent);
    expect(failedToConnect(new undici.errors.ConnectTimeoutError())).toBe(true);
    expect(translateTransportError(new undici.errors.HeadersTimeoutError(), 'call').code).toBe(
      ProviderErrorCode.Timeout,
    );
    expect(translateTransportError(new undici.errors.BodyTimeoutError(), 'call').code).toBe(
      ProviderErrorCode.Timeout,
    );
  });

  /**
   * In a plain node process (Jest's own environment loads Node's undici for its globals): the
   * provider clients bundled from `src/` with their dependencies external, as in `dist/main.js`.
   */
  describe("Node's bundled undici", () => {
    let build: string;
    beforeAll(() => (build = mkdtempSync(join(tmpdir(), 'tb-provider-http-build-'))));
    afterAll(() => rmSync(build, { recursive: true, force: true }));

    function nodeUndiciLoaded(contents: string): boolean {
      const bundle = join(build, `${Math.random().toString(36).slice(2)}.js`);
      bundleForNode(contents, bundle);
      const script = `
        require(${JSON.stringify(bundle)});
        console.log(process.moduleLoadList.some((m) => m.includes('internal/deps/undici')));`;
      const { status, stdout, stderr } = spawnSync(process.execPath, ['-e', script], {
        encoding: 'utf8',
        env: { ...process.env, NODE_PATH: join(ROOT, 'node_modules') },
      });
      expect(stderr).toBe('');
      expect(status).toBe(0);
      return JSON.parse(stdout) as boolean;
    }

    it('stays unloaded by the provider clients and their agents', () => {
      const loaded = nodeUndiciLoaded(
        [
          "import { AuthServerClient } from './provider/auth-server.client';",
          "import { createCheckoutAgent, ProviderApiClient } from './provider/provider-api.client';",
          "import { createProviderAgent } from './provider/provider-http';",
          'void [AuthServerClient, ProviderApiClient];',
          'createCheckoutAgent({ connectTimeoutMs: 1000, headersTimeoutMs: 1000, bodyTimeoutMs: 1000 } as never).close();',
          'createProviderAgent({ connectTimeoutMs: 1000, responseTimeoutMs: 1000 } as never).close();',
        ].join('\n'),
      );
      expect(loaded).toBe(false);
    });

    it("is loaded by undici's index, the reason for the paths above", () => {
      expect(nodeUndiciLoaded("import { Agent } from 'undici'; void Agent;")).toBe(true);
    });
  });
});

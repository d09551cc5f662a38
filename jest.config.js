/** @type {import('jest').Config} */
const tsJest = ['ts-jest', { tsconfig: 'tsconfig.json' }];
// jose 6 ships ES modules only. Node >= 20.19 require()s them natively; Jest's CommonJS
// runtime does not (before Node 24.9), so the tests compile jose to CommonJS on the fly.
const esmOnly = [
  'ts-jest',
  { tsconfig: { allowJs: true, module: 'commonjs', target: 'ES2022', isolatedModules: true } },
];
const esmTransform = { '/node_modules/jose/.+\\.js$': esmOnly };
const transformIgnorePatterns = ['/node_modules/(?!jose/)'];

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

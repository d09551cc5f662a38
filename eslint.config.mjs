// @ts-check
import eslint from '@eslint/js';
import tseslint from 'typescript-eslint';

/**
 * Module boundaries: the `src/` folders each folder's code may import. Adapters (config,
 * logging, secrets, provider, redis, metrics) never reach into features; a feature reaches an
 * adapter only through its module's ports; `redis` implements ports that the token and forwarding
 * folders declare, and may import those files only; `http` imports no feature, since each
 * exception carries its own status. Specs are exempt (they wire real adapters on purpose).
 * Top-level files (app.module, bootstrap, main) compose it all.
 */
const SRC_FOLDERS = [
  'admin',
  'caller-auth',
  'config',
  'dpop',
  'errors',
  'forwarding',
  'health',
  'http',
  'logging',
  'metrics',
  'openapi',
  'provider',
  'redis',
  'secrets',
  'token',
];
/** Folder -> folders it may import wholly, or `{ folder: [files] }` for some files only. */
const BOUNDARIES = {
  errors: [],
  config: ['errors'],
  logging: ['config', 'errors'],
  metrics: ['config', 'errors', 'logging'],
  secrets: ['config', 'errors', 'logging'],
  // DPoP proofs: the fleet's keys and nonces; the store is handed in like the token store's.
  dpop: ['config', 'errors', 'logging', 'secrets'],
  provider: ['config', 'dpop', 'errors', 'logging', 'secrets'],
  redis: [
    'config',
    'errors',
    'logging',
    'provider',
    'secrets',
    { dpop: ['dpop-store'] },
    {
      token: [
        'token-store',
        'token-store\\.memory',
        'token-store\\.exception',
        'token-record',
        'token-cipher',
        'token-cipher\\.factory',
      ],
    },
    {
      forwarding: [
        'idempotency-store',
        'idempotency-store\\.memory',
        'forward-rate-limiter',
        'forwarding\\.constants',
      ],
    },
  ],
  'caller-auth': ['config', 'errors', 'logging', 'secrets', { http: ['request\\.exception'] }],
  // The problem writer reads what exceptions carry, so it knows no feature.
  http: ['errors'],
  // Not redis: it implements their ports, so the app module hands it to them (`withStore`).
  token: [
    'caller-auth',
    'config',
    'dpop',
    'errors',
    'http',
    'logging',
    'metrics',
    'provider',
    'secrets',
  ],
  // `POST /orders` and the provider passthrough: one route, two profiles.
  forwarding: [
    'caller-auth',
    'config',
    'errors',
    'http',
    'logging',
    'metrics',
    'provider',
    'token',
  ],
  health: ['config', 'errors', 'logging', 'token', { http: ['listeners'] }],
  // The OpenAPI document: generated from the routes' codes and each domain's status table.
  openapi: [
    'config',
    'errors',
    'http',
    { admin: ['admin\\.exception'] },
    { 'caller-auth': ['caller-auth\\.exception'] },
    { forwarding: ['forwarding\\.exception'] },
    { token: ['token\\.exception'] },
  ],
  // The operators' routes (and `/metrics`): caller auth (scope admin), the token layer's admin
  // methods, the metrics registry.
  admin: ['caller-auth', 'config', 'errors', 'http', 'logging', 'metrics', 'token'],
};

/** One `no-restricted-imports` override per folder: every other folder, minus what it may use. */
function boundaryConfigs() {
  return Object.entries(BOUNDARIES).map(([folder, allowed]) => {
    const whole = allowed.filter((a) => typeof a === 'string');
    const partial = Object.assign({}, ...allowed.filter((a) => typeof a !== 'string'));
    const forbidden = SRC_FOLDERS.filter(
      (f) => f !== folder && !whole.includes(f) && !(f in partial),
    );
    const patterns = [
      {
        regex: `^\\.\\./(${forbidden.join('|')})(/|$)`,
        message: `${folder}/ may not import this folder (module boundaries in eslint.config.mjs).`,
      },
      ...Object.entries(partial).map(([f, files]) => ({
        regex: `^\\.\\./${f}/(?!(${files.join('|')})$)`,
        message: `${folder}/ may import only ${files.join(', ').replaceAll('\\', '')} from ${f}/ (module boundaries in eslint.config.mjs).`,
      })),
      {
        regex: '^(\\.\\./)+(emulator|sandbox|bench|test)/',
        message: 'The app must not import development tools; they are not in the production build.',
      },
    ];
    return {
      files: [`src/${folder}/**/*.ts`],
      ignores: ['**/*.spec.ts'],
      rules: { 'no-restricted-imports': ['error', { patterns }] },
    };
  });
}

export default tseslint.config(
  {
    ignores: [
      'dist/**',
      'dist-tsc/**',
      'dist-dev/**',
      'packages/*/dist/**',
      '.tmp/**',
      'node_modules/**',
      'coverage/**',
      'eslint.config.mjs',
      'esbuild.config.mjs',
      'scripts/*.mjs',
      'jest.config.js',
      'helm/**',
    ],
  },
  eslint.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/switch-exhaustiveness-check': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_' }],
      '@typescript-eslint/require-await': 'off',
    },
  },
  {
    files: ['**/*.spec.ts', 'test/**/*.ts'],
    rules: {
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/unbound-method': 'off',
    },
  },
  {
    // Plain ESM scripts the tests run as processes of their own (an ESM-only dependency that
    // Jest's CommonJS cannot load): no TypeScript project to type-check them against.
    files: ['test/support/*.mjs'],
    ...tseslint.configs.disableTypeChecked,
    languageOptions: {
      ...tseslint.configs.disableTypeChecked.languageOptions,
      globals: { process: 'readonly' },
    },
  },
  ...boundaryConfigs(),
);

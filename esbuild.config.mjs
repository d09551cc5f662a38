// The production entry point, step 2 of `npm run build`: bundles what tsc compiled into
// `dist-tsc/` (JavaScript that already carries Nest's decorator metadata, which esbuild cannot
// emit from TypeScript) together with its dependencies into one CommonJS file, `dist/main.js`.
// Why: a replica spends most of its start-up CPU finding, reading and compiling ~1,050 module
// files one by one (Nest 12 and rxjs are ESM, loaded through require(esm) on Node 20); one file
// is read and compiled once. A plain bundle: no dependency is patched, nothing is left out of it
// but what `external` lists below.
import { build } from 'esbuild';

/**
 * Left to `require` from node_modules at run time, each for a reason:
 */
const external = [
  // OpenTelemetry instruments these by hooking `require` (require-in-the-middle): bundled, the
  // hook would never see them load and tracing would lose their spans. (undici is not here: its
  // instrumentation listens on `diagnostics_channel`, which works on a bundled copy as well.)
  'ioredis',
  // Loaded lazily, only when the configuration uses them (test/lazy-dependencies.e2e-spec.ts):
  // the AWS SDK for a Secrets Manager secret id (also instrumented through `require`), jose in
  // kubernetes caller-auth mode, and OpenTelemetry when OTEL_* variables turn tracing on.
  '@aws-sdk/*',
  'jose',
  '@opentelemetry/*',
  // Optional packages Nest probes with `import()` for features the broker does not use; they
  // are not installed, so at run time the probe fails as it does without a bundle.
  '@nestjs/microservices',
  '@nestjs/websockets',
  '@nestjs/platform-express',
  '@fastify/multipart',
  '@fastify/static',
  '@fastify/view',
  'class-validator',
  'class-transformer',
];

await build({
  entryPoints: ['dist-tsc/main.js'],
  outfile: 'dist/main.js',
  bundle: true,
  platform: 'node',
  format: 'cjs',
  // The oldest Node package.json `engines` allows.
  target: 'node20.19',
  external,
  // Neither identifiers nor syntax are minified, so functions and classes keep their names in
  // stack traces, Nest's logs and pino's `err.type`. No `keepNames`: it wraps every named function
  // expression in a `__name()` call, which then runs per request on the hot paths (about 6 % of
  // the CPU of `POST /orders`). Without it, 36 decorated classes of Nest's ES modules, hoisted
  // into one scope, get a suffix: the start-up line "TerminusModule2 dependencies initialized".
  // Whitespace and comments only, so that the file is pure ASCII: V8 keeps a module's source in
  // memory for its whole life, one byte a character, but two bytes for all of it once a single
  // character is not Latin-1 (a few comments of dependencies are UTF-8).
  minifyWhitespace: true,
  charset: 'ascii',
  // The dependencies' license notices, which minifying would keep inline (one is not ASCII).
  legalComments: 'external',
  // Chained through tsc's own maps: dist/main.js.map points at src/*.ts, so with
  // `node --enable-source-maps` a stack trace reads as before the bundle. The image is built
  // with BUNDLE_SOURCE_MAP=false: it would ship a map of the source tree that nothing there reads.
  sourcemap: process.env.BUNDLE_SOURCE_MAP === 'false' ? false : 'linked',
  sourcesContent: false,
  // Nest's ESM code asks `import.meta` where it is, to `createRequire` its optional packages; in
  // a CommonJS bundle that is this file, whose node_modules are the same.
  define: {
    'import.meta.url': '__bundle_import_meta_url',
    'import.meta.dirname': '__dirname',
    'import.meta.resolve': 'require.resolve',
  },
  banner: {
    js: "const __bundle_import_meta_url = require('node:url').pathToFileURL(__filename).href;",
  },
  logLevel: 'warning',
}).then((result) => {
  // A warning is a bundle that may break at run time: fail the build instead.
  if (result.warnings.length > 0) {
    throw new Error(`esbuild: ${result.warnings.length} warning(s) above; the bundle may not run`);
  }
});

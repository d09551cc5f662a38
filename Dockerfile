# syntax=docker/dockerfile:1

# Node 26 ("Lithium") is the Active LTS line since 2026-10-28; 24 moved to maintenance.
# `.ci/run` reads the major from NODE_IMAGE's default below and runs the whole test suite on that
# major (the `node@26` npm package), so the tests prove the runtime the image ships.
# The base image of both stages. A tag moves: a release build pins the digest it was tested on,
# `--build-arg NODE_IMAGE=node:26-trixie-slim@sha256:<digest>` (or a mirror's copy of it), and
# lets Renovate/Dependabot bump it. Keep the major: it is the one the tests ran on.
ARG NODE_IMAGE=node:26-trixie-slim

# ---- build: full dependency tree, compile, then drop the dev dependencies -------------------
FROM ${NODE_IMAGE} AS build
WORKDIR /app
# The manifest and lockfile alone first, so the dependency layer is reused until they change.
COPY package.json package-lock.json ./
# Exactly the lockfile's tree. No install scripts: no production dependency needs one, and
# nothing a dependency ships runs at build time.
RUN npm ci --no-audit --no-fund --ignore-scripts
COPY tsconfig.json tsconfig.build.json esbuild.config.mjs ./
# The app only: the emulators, the sandbox and the benchmarks live outside src/ (built into
# dist-dev/ by `npm run build:dev`) and are not even in the build context.
COPY src ./src
# `npm run build`: tsc compiles src/ into dist-tsc/, then esbuild bundles that with its
# dependencies into one file, dist/main.js (esbuild.config.mjs says why and what it leaves out),
# without a source map: the image runs the bundle, nobody debugs it from there.
# --omit=optional as well: every optional package in the production tree is either the helm
# binary the chart tests use (an optional dependency so that npm ci works off Linux) or there
# because a dev dependency (testcontainers) installed it and it satisfies an optional peer of
# @nestjs/terminus (gRPC health checks, unused): @grpc/*, protobufjs, @types/node, yargs...
# No production dependency has an optional dependency of its own; revisit if one ever does.
RUN BUNDLE_SOURCE_MAP=false npm run build \
 && npm prune --omit=dev --omit=optional --no-audit --no-fund --ignore-scripts

# ---- runtime: node, the pruned node_modules and dist, nothing else --------------------------
# node_modules still holds every production dependency: the bundle requires the ones it leaves
# out (ioredis, the AWS SDK, jose, OpenTelemetry) from there.
FROM ${NODE_IMAGE} AS runtime
# `node dist/main.js` needs neither npm, npx nor corepack; removing them removes their
# dependencies from image scans and from an attacker's toolbox.
RUN rm -rf /usr/local/lib/node_modules /usr/local/bin/npm /usr/local/bin/npx \
      /usr/local/bin/corepack /usr/local/bin/yarn /usr/local/bin/yarnpkg /opt/yarn-*
ENV NODE_ENV=production
# Memory per client (docs/benchmarks.md, scale rows): glibc gives each thread that allocates its
# own malloc arena, up to 8 per core, and keeps what they once held; two serve the broker's one
# JavaScript thread and libuv's pool as fast, in a fraction of the RSS.
ENV MALLOC_ARENA_MAX=2
WORKDIR /app
# Owned by root and not writable by the runtime user: the process cannot modify its own code,
# and the root filesystem can be mounted read-only. The broker writes nothing to disk (logs go
# to stdout); the chart still mounts an emptyDir on /tmp for the runtime's own temp files.
COPY --from=build /app/package.json ./package.json
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
# The base image's `node` user, by number so Kubernetes' runAsNonRoot can verify it.
USER 1000:1000
EXPOSE 8080
# Node runs as PID 1 without an init process on purpose: main.ts handles SIGTERM and SIGINT
# itself (stops accepting, drains in-flight requests, releases the refresh lock, exits 0 within
# SHUTDOWN_GRACE_MS), and the broker starts no child processes, so there are no zombies to reap.
# --max-semi-space-size (MB): V8 grows the young generation up to 16 MB per semi-space after a
# burst of allocations (a thousand clients' first tokens) and keeps it; 2 MB bounds that, at no
# measurable cost to GET /token (docs/benchmarks.md). Flags here win over NODE_OPTIONS; to change
# one, override the container's command.
CMD ["node", "--max-semi-space-size=2", "dist/main.js"]

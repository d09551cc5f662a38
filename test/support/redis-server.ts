// Kept only for the suites another branch is moving onto the shared harness; remove at merge.
export { startRedis, type TestRedis } from './redis/standalone';

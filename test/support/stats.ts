/**
 * Largest and smallest of many numbers. `Math.max(...values)` passes every value as an
 * argument and overflows the call stack past ~100k values (a load test's answers).
 */
export function maxOf(values: Iterable<number>, empty = 0): number {
  let max = -Infinity;
  for (const value of values) if (value > max) max = value;
  return max === -Infinity ? empty : max;
}

export function minOf(values: Iterable<number>, empty = 0): number {
  let min = Infinity;
  for (const value of values) if (value < min) min = value;
  return min === Infinity ? empty : min;
}

/**
 * How far Redis's clock is ahead of this replica's (`redisNow − localNow`, ms), bounded from
 * round trips: a reply carrying Redis's `TIME` that was sent at local `sentAt` and arrived at
 * `arrivedAt` proves the offset lies in `[redisNow − arrivedAt, redisNow − sentAt]`.
 *
 * One round trip under load (a busy event loop, a queued command) can take a hundred ms, and
 * converting with that trip alone would shorten a token by as much. The upper bound keeps the
 * tightest recent trip instead (Cristian's algorithm with a minimum filter): every trip's
 * upper bound is valid, so the smallest is too, as long as neither clock is stepped meanwhile.
 * Bounds older than `maxAgeMs` are dropped so a stepped clock is trusted again after a while.
 */
export class RedisClockOffset {
  private best?: { upper: number; at: number };

  constructor(private readonly maxAgeMs = 60_000) {}

  /** Records one round trip; returns the offset's bounds for that trip's conversion. */
  observe(sentAt: number, arrivedAt: number, redisNow: number): { upper: number; lower: number } {
    const upper = redisNow - sentAt;
    if (
      this.best === undefined ||
      upper <= this.best.upper ||
      arrivedAt - this.best.at > this.maxAgeMs
    ) {
      this.best = { upper, at: arrivedAt };
    }
    // The lower bound comes from this trip: a past trip's lower bound would be as valid, but
    // the best upper bound already makes the conversion tight.
    return { upper: this.best.upper, lower: Math.min(redisNow - arrivedAt, this.best.upper) };
  }
}

/**
 * Bounds on Redis's clock offset from round trips. One trip under load can take a hundred ms,
 * which would shorten a token by as much, so the upper bound keeps the tightest recent trip
 * (Cristian's algorithm with a minimum filter); old bounds are dropped so a stepped clock is
 * trusted again after `maxAgeMs`.
 */
export class RedisClockOffset {
  private best?: { upper: number; at: number };

  constructor(private readonly maxAgeMs = 60_000) {}

  observe(sentAt: number, arrivedAt: number, redisNow: number): { upper: number; lower: number } {
    const upper = redisNow - sentAt;
    if (
      this.best === undefined ||
      upper <= this.best.upper ||
      arrivedAt - this.best.at > this.maxAgeMs
    ) {
      this.best = { upper, at: arrivedAt };
    }
    // The best upper bound already makes the conversion tight; the lower one is this trip's.
    return { upper: this.best.upper, lower: Math.min(redisNow - arrivedAt, this.best.upper) };
  }
}

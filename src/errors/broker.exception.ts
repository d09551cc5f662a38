export interface BrokerExceptionOptions {
  /** The error this one translates. Always pass it. */
  cause?: unknown;
  /** Feeds `Retry-After` when answered. */
  retryAfterSeconds?: number;
}

/** RFC 9457 `status` and `title`. */
export interface ProblemStatus {
  readonly status: number;
  readonly title: string;
  /** When the exception does not say (its `retryAfterSeconds` wins). */
  readonly retryAfterSeconds?: number;
  readonly challenge?: string;
}

/** A `Record` over the code enum: a new code is a compile error until it has a status. */
export type ProblemTable<Code extends string> = Readonly<Record<Code, ProblemStatus>>;

/**
 * A stable `code` callers and dashboards key on, a message saying what to do; one subclass per
 * domain, so `instanceof` tells the domain and the compiler checks the codes.
 */
export abstract class BrokerException<Code extends string = string> extends Error {
  readonly retryAfterSeconds?: number;

  constructor(
    readonly code: Code,
    message: string,
    options: BrokerExceptionOptions = {},
  ) {
    // Error sets `cause` only when the key is present.
    super(message, options);
    this.name = new.target.name;
    this.retryAfterSeconds = options.retryAfterSeconds;
  }

  /** Undefined for internal domains (provider, secrets, stores): messages may name internals. */
  get problemStatus(): ProblemStatus | undefined {
    return undefined;
  }
}

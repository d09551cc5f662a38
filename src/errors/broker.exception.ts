/** What every broker exception may carry besides its code and message. */
export interface BrokerExceptionOptions {
  /** The error this one translates (a library error, a lower layer's exception). Always pass it. */
  cause?: unknown;
  /** How long the caller should wait before trying again; feeds `Retry-After` when answered. */
  retryAfterSeconds?: number;
}

/** How a caller-facing code is answered over HTTP (RFC 9457 `status` and `title`). */
export interface ProblemStatus {
  readonly status: number;
  readonly title: string;
  /** `Retry-After` when the exception does not say (its `retryAfterSeconds` wins); none if absent. */
  readonly retryAfterSeconds?: number;
  /** The `WWW-Authenticate` challenge sent with the answer, if any. */
  readonly challenge?: string;
}

/**
 * A domain's answer for each of its codes. A `Record` over the code enum, so a new code is a
 * compile error in the file that adds it until it has a status.
 */
export type ProblemTable<Code extends string> = Readonly<Record<Code, ProblemStatus>>;

/**
 * The one base of the broker's exceptions: a stable `code` from the domain's enum (callers and
 * dashboards key on it), a message saying what to do, and options. Each domain (token, orders,
 * provider, secrets, ...) has one subclass fixing `Code` to its enum, so `instanceof` still
 * tells the domain and the compiler still checks the codes.
 *
 * One constructor shape everywhere: `(code, message, options?)`. Domain-specific details (the
 * provider's status, a secret's reference) are extra fields of that domain's options.
 */
export abstract class BrokerException<Code extends string = string> extends Error {
  /** Seconds to wait before retrying, when the thrower knows; see {@link BrokerExceptionOptions}. */
  readonly retryAfterSeconds?: number;

  constructor(
    readonly code: Code,
    message: string,
    options: BrokerExceptionOptions = {},
  ) {
    // Error reads `cause` from the options, and only when the key is present: an exception
    // built without one has no `cause` property at all, as before the common base.
    super(message, options);
    this.name = new.target.name;
    this.retryAfterSeconds = options.retryAfterSeconds;
  }

  /**
   * How a caller is answered: the entry for `code` in the domain's {@link ProblemTable}, which
   * caller-facing domains supply by overriding this. Undefined for the internal domains
   * (provider, secrets, stores): their messages may name internals, so they answer a plain 500.
   */
  get problemStatus(): ProblemStatus | undefined {
    return undefined;
  }
}

/** What every broker exception may carry besides its code and message. */
export interface BrokerExceptionOptions {
  /** The error this one translates (a library error, a lower layer's exception). Always pass it. */
  cause?: unknown;
  /** How long the caller should wait before trying again; feeds `Retry-After` when answered. */
  retryAfterSeconds?: number;
}

/**
 * The one base of the broker's exceptions: a stable `code` from the domain's enum (callers,
 * dashboards and `src/http/problem.ts` key on it), a message saying what to do, and options.
 * Each domain (token, orders, provider, secrets, ...) has one subclass fixing `Code` to its
 * enum, so `instanceof` still tells the domain and the compiler still checks the codes.
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
}

// The client's public API is written in the `callers` work; this placeholder keeps the
// workspace buildable until then.
export {};

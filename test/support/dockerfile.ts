/**
 * The Dockerfile as the image build reads it, for the suites and the bench that replay it
 * (`test/runtime-stage.e2e-spec.ts`, `bench/paths.ts`) without a container engine.
 */

export interface Instruction {
  op: string;
  args: string;
}

export interface Stage {
  /** As the build resolves it with no `--build-arg`: the global `ARG`s' defaults substituted. */
  image: string;
  /** As written, e.g. `${NODE_IMAGE}`. */
  imageAsWritten: string;
  name: string | undefined;
  instructions: Instruction[];
}

/** The `ARG`s before the first `FROM`, with their defaults: what `FROM` lines may use. */
export function globalArgs(text: string): Map<string, string | undefined> {
  const args = new Map<string, string | undefined>();
  for (const line of text.split('\n').map((l) => l.trim())) {
    if (/^FROM\s/i.test(line)) break;
    const m = /^ARG\s+(\w+)(?:=(\S*))?$/i.exec(line);
    if (m) args.set(m[1], m[2]);
  }
  return args;
}

/** Splits a Dockerfile into stages of instructions (continuations joined, comments dropped). */
export function parseDockerfile(text: string): Stage[] {
  const args = globalArgs(text);
  const logical: string[] = [];
  let pending = '';
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    // Comment lines are dropped even inside a continuation, as BuildKit does.
    if (line.startsWith('#') || (line === '' && pending === '')) continue;
    if (line.endsWith('\\')) {
      pending += `${line.slice(0, -1)} `;
      continue;
    }
    logical.push(`${pending}${line}`.trim());
    pending = '';
  }
  const stages: Stage[] = [];
  for (const line of logical.filter((l) => l !== '')) {
    const [, op, rest] = /^(\S+)\s*(.*)$/.exec(line) ?? [];
    const upper = op.toUpperCase();
    if (upper === 'ARG' && stages.length === 0) continue;
    if (upper === 'FROM') {
      const [, image, name] = /^(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?$/i.exec(rest) ?? [];
      const resolved = image.replace(/\$\{(\w+)\}|\$(\w+)/g, (_m, a?: string, b?: string) => {
        const value = args.get((a ?? b)!);
        if (value === undefined)
          throw new Error(`Dockerfile: FROM ${image} uses an ARG without a default`);
        return value;
      });
      stages.push({ image: resolved, imageAsWritten: image, name, instructions: [] });
    } else {
      if (stages.length === 0) throw new Error(`Dockerfile: ${upper} before the first FROM`);
      stages[stages.length - 1].instructions.push({ op: upper, args: rest });
    }
  }
  return stages;
}

/** The variables of one `ENV` instruction's arguments (`A=b C="d e"`). */
export function envOf(args: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const m of args.matchAll(/(\w+)=("[^"]*"|\S+)/g)) env[m[1]] = m[2].replace(/^"|"$/g, '');
  return env;
}

import { z } from 'zod';

/**
 * What a config field says about itself, beside its type and default: the one place a setting's
 * description and environment variable are written. The loader's environment table, the
 * configuration reference (`npm run docs:config`) and the Helm chart's values schema are all
 * derived from it.
 */
declare module 'zod' {
  interface GlobalMeta {
    /** The environment variable that sets this field. */
    env?: string;
    /**
     * Variables that set fields of a schema shared by several settings (a secret reference:
     * `{ secretId: 'CACHE_KEY_SECRET_ID', file: 'CACHE_KEY_FILE' }`); the setting itself is
     * named by them, joined with "or", when it is required and nobody supplied it.
     */
    envFields?: Readonly<Record<string, string>>;
    /** The default as the reference writes it, when the value alone does not tell it. */
    defaultText?: string;
  }
}

export type SettingMeta = z.GlobalMeta;

/** One field of a config schema: its path (`[]` for a list's items) and its metadata. */
export interface SettingField {
  readonly path: readonly string[];
  readonly meta: SettingMeta;
  /** The value of its `.default()`, when it has one. */
  readonly default?: { readonly value: unknown };
}

/** One environment variable and the config path it sets. */
export interface EnvSetting {
  readonly env: string;
  readonly path: readonly string[];
}

type Def = {
  type: string;
  shape?: Record<string, z.ZodType>;
  element?: z.ZodType;
  innerType?: z.ZodType;
  in?: z.ZodType;
  out?: z.ZodType;
  getter?: () => z.ZodType;
  defaultValue?: unknown;
};

const defOf = (schema: z.ZodType): Def => schema._zod.def;

/**
 * A field's schema with its wrappers (optional, default, preprocess...) peeled off, and the
 * metadata found on the way: the outermost wins, so a use site overrides a shared schema's own.
 */
function unwrap(schema: z.ZodType): {
  core: z.ZodType;
  meta: SettingMeta;
  default?: { value: unknown };
} {
  const metas: SettingMeta[] = [];
  let found: { value: unknown } | undefined;
  let node = schema;
  for (;;) {
    const meta = z.globalRegistry.get(node);
    if (meta) metas.push(meta);
    const def = defOf(node);
    if (def.type === 'default' && found === undefined) found = { value: def.defaultValue };
    let next: z.ZodType | undefined;
    if (def.innerType) next = def.innerType;
    else if (def.type === 'lazy' && def.getter) next = def.getter();
    else if (def.type === 'pipe' && def.in && def.out) {
      // `z.preprocess(fn, s)` reads as `s`; `s.transform(fn)` as `s`.
      next = defOf(def.in).type === 'transform' ? def.out : def.in;
    }
    if (next === undefined) break;
    node = next;
  }
  const meta = Object.assign({}, ...metas.reverse()) as SettingMeta;
  return found === undefined ? { core: node, meta } : { core: node, meta, default: found };
}

/** Every field of an object schema, depth first in declaration order, list items included. */
export function settingFields(schema: z.ZodType): SettingField[] {
  const fields: SettingField[] = [];
  const visit = (node: z.ZodType, path: string[]): void => {
    const { core } = unwrap(node);
    const def = defOf(core);
    if (def.type === 'array' && def.element) {
      visit(def.element, [...path, '[]']);
      return;
    }
    if (def.type !== 'object' || def.shape === undefined) return;
    for (const [name, child] of Object.entries(def.shape)) {
      const { meta, default: value } = unwrap(child);
      fields.push(
        value === undefined
          ? { path: [...path, name], meta }
          : { path: [...path, name], meta, default: value },
      );
      visit(child, [...path, name]);
    }
  };
  visit(schema, []);
  return fields;
}

/** The variables of these fields, each with the path it sets, in declaration order. */
export function envSettings(fields: readonly SettingField[]): EnvSetting[] {
  return fields.flatMap(({ path, meta }) => [
    ...(meta.env === undefined ? [] : [{ env: meta.env, path }]),
    ...Object.entries(meta.envFields ?? {}).map(([field, env]) => ({
      env,
      path: [...path, field],
    })),
  ]);
}

/** Path -> "A or B" for each setting whose fields are set by variables of their own. */
export function envAlternatives(fields: readonly SettingField[]): Map<string, string> {
  return new Map(
    fields
      .filter(({ meta }) => meta.envFields !== undefined)
      .map(({ path, meta }) => [path.join('.'), Object.values(meta.envFields ?? {}).join(' or ')]),
  );
}

/**
 * The Arrow IPC stream codec (PROTOCOL.md section 7, id 4) over
 * [apache-arrow](https://www.npmjs.com/package/apache-arrow), an optional dependency: the SDK
 * builds and runs without it, and only `codec("arrow")` then fails, naming the package to install.
 *
 * A value is an apache-arrow `Table` (a `RecordBatch` or a plain object of column arrays is
 * encoded as one); it travels as one IPC stream (schema, then its record batches), as Python's
 * `pyarrow.ipc.new_stream` writes it, and decodes to a `Table`.
 *
 * @example
 * ```ts
 * import { tableFromArrays } from "apache-arrow";
 * import { codec } from "wirepool/codecs";
 * const arrow = codec("arrow");
 * const table = arrow.decode(Buffer.from(arrow.encode(tableFromArrays({ n: Int32Array.of(1, 2) }))));
 * ```
 * @module
 */

import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { CodecId } from "../proto/constants.js";
import type { Codec } from "./index.js";

/** The package this codec needs. */
export const ARROW_PACKAGE = "apache-arrow";

/**
 * The part of apache-arrow this codec uses. Typed here rather than imported so that neither the
 * SDK's build nor its published typings need the optional package.
 */
export interface ArrowModule {
  Table: new (...batches: unknown[]) => unknown;
  RecordBatch: abstract new (...args: never[]) => unknown;
  tableToIPC(table: unknown, type: "stream"): Uint8Array;
  tableFromIPC(bytes: Uint8Array): unknown;
  tableFromArrays(columns: Record<string, unknown>): unknown;
}

const require = createRequire(import.meta.url);

/**
 * apache-arrow's ES module build: the one an application's `import "apache-arrow"` gets. Its
 * CommonJS build has classes of its own, whose writer cannot read a Table made by the ES build
 * (the dual-package hazard), so it is only the fallback where Node cannot `require` an ES module
 * (before 20.19). `require` keeps loading synchronous, as `codec()` is.
 */
function loadApacheArrow(): ArrowModule {
  const path = fileURLToPath(import.meta.resolve(ARROW_PACKAGE));
  try {
    return require(path) as ArrowModule;
  } catch (err) {
    if ((err as { code?: unknown }).code === "ERR_REQUIRE_ESM") return require(ARROW_PACKAGE) as ArrowModule;
    throw err;
  }
}

function isNotInstalled(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return code === "ERR_MODULE_NOT_FOUND" || code === "MODULE_NOT_FOUND";
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (value === null || typeof value !== "object") return false;
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

/** The codec over a loaded apache-arrow module. */
function codecOver(arrow: ArrowModule): Codec {
  return {
    id: CodecId.ARROW_IPC,
    name: "arrow",
    encode(value: unknown): Uint8Array {
      let table: unknown;
      if (value instanceof arrow.Table) table = value;
      else if (value instanceof arrow.RecordBatch) table = new arrow.Table(value);
      else if (isPlainObject(value)) table = arrow.tableFromArrays(value);
      else {
        throw new TypeError(
          "the arrow codec encodes an apache-arrow Table or RecordBatch (made by the apache-arrow this SDK loads) " +
            `or an object of column arrays, not ${value === null ? "null" : typeof value === "object" ? value.constructor?.name ?? "object" : typeof value}`,
        );
      }
      return arrow.tableToIPC(table, "stream");
    },
    // apache-arrow reads the stream in place: a column's buffers are views of `bytes` where they
    // are aligned for their type, copies where not.
    decode(bytes: Buffer): unknown {
      return arrow.tableFromIPC(bytes);
    },
  };
}

let loaded: { codec: Codec } | { error: Error } | undefined;

/**
 * The Arrow codec, loading apache-arrow on first use (through `load`, for tests; the loader's
 * outcome is cached only for the default one).
 * @throws Error naming the package to install when apache-arrow is absent.
 */
export function arrowCodec(load?: () => ArrowModule): Codec {
  if (load === undefined && loaded !== undefined) {
    if ("codec" in loaded) return loaded.codec;
    throw loaded.error;
  }
  let outcome: { codec: Codec } | { error: Error };
  try {
    outcome = { codec: codecOver((load ?? loadApacheArrow)()) };
  } catch (err) {
    const message = isNotInstalled(err)
      ? `the arrow codec needs the optional package ${ARROW_PACKAGE}: npm install ${ARROW_PACKAGE}`
      : `the arrow codec could not load ${ARROW_PACKAGE}: ${(err as Error)?.message ?? String(err)}`;
    outcome = { error: new Error(message, { cause: err }) };
  }
  if (load === undefined) loaded = outcome;
  if ("codec" in outcome) return outcome.codec;
  throw outcome.error;
}

/** Whether apache-arrow can be loaded (the arrow codec is usable). */
export function arrowAvailable(): boolean {
  try {
    arrowCodec();
    return true;
  } catch {
    return false;
  }
}

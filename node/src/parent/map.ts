/**
 * `pool.map`: one call per request, within a window of calls in flight and a bound on the
 * results not read yet (the Python parent's `_MapRun`, PROTOCOL.md 22.2 for its options).
 * @module
 */

import { CallerInput } from "../proto/constants.js";
import type { WirepoolError } from "./errors.js";
import { callSettings, invalid, methodName } from "./options.js";
import type { CallOptions, Pool } from "./pool.js";

/** Options of {@link Pool.map}: a call's options (for every call), and how results come back. */
export interface MapOptions extends CallOptions {
  /**
   * `true` (the default): results in the order of the requests. `false`: as the calls finish
   * (a slow first call comes last), as Python's `map(ordered=False)`.
   */
  readonly ordered?: boolean;
  /**
   * `false` (the default): the first failed call ends the map with its error. `true`: a failed
   * call's typed error ({@link WirepoolError}) is yielded in its place and the map goes on, as
   * `asyncio.gather(return_exceptions=True)`.
   */
  readonly returnExceptions?: boolean;
  /**
   * The most calls in flight at once, 1 - 4,294,967,295 (default: workers x maxInFlight); at
   * most two windows of requests are taken from the iterable and not read back yet.
   */
  readonly window?: number;
}

/** One request of a map: its outcome once the call has ended. */
interface Slot<R> {
  done: boolean;
  ok: boolean;
  value: R | WirepoolError;
}

/**
 * The results of {@link Pool.map}: an async iterator (`for await`), read as they come, or a
 * promise of them all (`await pool.map(...)`: an array). The requests are taken from their
 * iterable as the map goes, with at most `window` calls in flight and at most two windows
 * taken and not read back yet: a slow reader stalls the map, never queues without bound. Read
 * it one way only (iterate it, or await it once).
 *
 * Leaving the loop early (`break`, `return()`, `await using`) stops the map: no more requests
 * are taken; the calls in flight finish and their results are dropped. Without
 * `returnExceptions`, a failed call ends the map the same way, with its error.
 *
 * @example
 * ```ts
 * for await (const r of pool.map("resize", images, { ordered: false, returnExceptions: true })) {
 *   if (r instanceof WirepoolError) console.error(r.codeName); else save(r);
 * }
 * const all = await pool.map("add", [{ a: 1, b: 1 }, { a: 2, b: 2 }]); // in order
 * ```
 */
export class MapResults<R> implements AsyncIterableIterator<R>, PromiseLike<R[]> {
  /** Ordered: every request taken and not read, in order; unordered: the finished ones. */
  private results: Slot<R>[] = [];
  private head = 0;
  private inFlight = 0;
  private source: Iterator<unknown> | null = null;
  private exhausted = false;
  private stopped = false;
  /** Why the map cannot go on (a refused option, the iterable threw), for the next read. */
  private failure: { error: unknown } | null = null;
  private failureThrown = false;
  private waiter: { resolve: (r: IteratorResult<R>) => void; reject: (e: unknown) => void } | null = null;
  private all_: Promise<R[]> | null = null;
  private readonly ordered: boolean;
  private readonly returnExceptions: boolean;
  private readonly window: number;
  private readonly method: string;

  /** @internal */
  constructor(
    private readonly pool: Pool,
    method: unknown,
    requests: Iterable<unknown>,
    private readonly opts: MapOptions | undefined,
    defaultWindow: number,
  ) {
    let ordered = true;
    let returnExceptions = false;
    let window = Math.max(1, Math.min(defaultWindow, CallerInput.maxCount));
    let name = "";
    try {
      name = methodName(method);
      callSettings(opts, pool.settings.codec); // the call options, checked once for all (22.2)
      if (opts !== undefined && opts !== null) {
        ordered = flag("ordered", opts.ordered, true);
        returnExceptions = flag("returnExceptions", opts.returnExceptions, false);
        if (opts.window !== undefined) window = windowOption(opts.window);
      }
      if (requests === null || typeof (requests as Partial<Iterable<unknown>>)?.[Symbol.iterator] !== "function") {
        throw invalid("requests", "an iterable of requests", requests);
      }
      this.source = requests[Symbol.iterator]();
    } catch (e) {
      this.fail(e);
    }
    this.method = name;
    this.ordered = ordered;
    this.returnExceptions = returnExceptions;
    this.window = window;
    this.pump();
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  /** The next result; done after the last; rejects once with the map's error. */
  next(): Promise<IteratorResult<R>> {
    const r = this.take();
    if (r !== null) return r;
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }

  /** Stops the map (no more requests are sent; the results of calls in flight are dropped). */
  return(): Promise<IteratorResult<R>> {
    this.stop();
    return Promise.resolve({ value: undefined, done: true });
  }

  /** Every result, as an array (in order unless `ordered: false`); rejects with the map's error. */
  then<A = R[], B = never>(onFulfilled?: ((value: R[]) => A | PromiseLike<A>) | null, onRejected?: ((reason: unknown) => B | PromiseLike<B>) | null): Promise<A | B> {
    return this.all().then(onFulfilled, onRejected);
  }

  /** `then(undefined, onRejected)`. */
  catch<B = never>(onRejected?: ((reason: unknown) => B | PromiseLike<B>) | null): Promise<R[] | B> {
    return this.all().catch(onRejected);
  }

  /** As a promise's `finally`. */
  finally(onFinally?: (() => void) | null): Promise<R[]> {
    return this.all().finally(onFinally);
  }

  private all(): Promise<R[]> {
    if (this.all_ === null) {
      this.all_ = (async () => {
        const out: R[] = [];
        for (;;) {
          const r = await this.next();
          if (r.done) return out;
          out.push(r.value);
        }
      })();
    }
    return this.all_;
  }

  /** The next read if it can be answered now, else null (the reader waits). */
  private take(): Promise<IteratorResult<R>> | null {
    if (this.head < this.results.length && this.results[this.head].done) {
      const slot = this.results[this.head];
      this.results[this.head++] = undefined as unknown as Slot<R>;
      if (this.head === this.results.length) {
        this.results = [];
        this.head = 0;
      } else if (this.head > 1024 && this.head * 2 > this.results.length) {
        this.results = this.results.slice(this.head);
        this.head = 0;
      }
      if (!slot.ok && !this.returnExceptions) {
        this.stop();
        this.failure = { error: slot.value };
        this.failureThrown = true;
        return Promise.reject(slot.value);
      }
      this.pump();
      return Promise.resolve({ value: slot.value as R, done: false });
    }
    if (this.failure !== null && !this.failureThrown && this.head === this.results.length && this.inFlight === 0) {
      this.failureThrown = true;
      this.stop();
      return Promise.reject(this.failure.error);
    }
    if (this.stopped || (this.exhausted && this.inFlight === 0 && this.head === this.results.length)) {
      return Promise.resolve({ value: undefined, done: true });
    }
    return null;
  }

  /** Takes requests and calls them while the window and the unread bound allow. */
  private pump(): void {
    const source = this.source;
    if (source === null) return;
    const cap = 2 * this.window;
    while (!this.stopped && !this.exhausted && this.inFlight < this.window && this.inFlight + this.unread() < cap) {
      let item: IteratorResult<unknown>;
      try {
        item = source.next();
      } catch (e) {
        this.exhausted = true;
        this.fail(e);
        break;
      }
      if (item.done) {
        this.exhausted = true;
        break;
      }
      const slot: Slot<R> = { done: false, ok: false, value: undefined as unknown as R };
      if (this.ordered) this.results.push(slot);
      this.inFlight++;
      this.pool.submitCall<R>(this.method, item.value, this.opts, null).then(
        (v) => this.finished(slot, true, v),
        (e: WirepoolError) => this.finished(slot, false, e),
      );
    }
    this.wake();
  }

  /** Results finished and not read (ordered: the slots not read minus those in flight). */
  private unread(): number {
    return this.results.length - this.head - (this.ordered ? this.inFlight : 0);
  }

  private finished(slot: Slot<R>, ok: boolean, value: R | WirepoolError): void {
    this.inFlight--;
    if (this.stopped) return;
    slot.done = true;
    slot.ok = ok;
    slot.value = value;
    if (!this.ordered) this.results.push(slot);
    this.pump();
  }

  /** The map ends with `e` once the results before it are read (and the calls in flight ended). */
  private fail(e: unknown): void {
    if (this.failure !== null) return;
    this.failure = { error: e }; // a refused option's InvalidArgumentError, or what the caller's iterable threw, as it is
    this.exhausted = true;
  }

  private stop(): void {
    this.stopped = true;
    this.exhausted = true;
    this.results = [];
    this.head = 0;
    const src = this.source;
    this.source = null;
    try {
      src?.return?.();
    } catch {
      // the iterable's own clean-up failed: nothing more is taken from it anyway
    }
    this.wake();
  }

  private wake(): void {
    const w = this.waiter;
    if (w === null) return;
    this.waiter = null; // before take(), whose pump() wakes again
    const r = this.take();
    if (r === null) {
      this.waiter = w;
      return;
    }
    r.then(w.resolve, w.reject);
  }
}

/** A boolean map option: true or false only (1, "yes" or null are caller mistakes, 22.2). */
function flag(name: string, v: unknown, fallback: boolean): boolean {
  if (v === undefined) return fallback;
  if (typeof v === "boolean") return v;
  throw invalid(name, "true or false", v);
}

function windowOption(v: unknown): number {
  if (typeof v === "number" && Number.isInteger(v) && v >= 1 && v <= CallerInput.maxCount) return v;
  throw invalid("window", `an integer from 1 to ${CallerInput.maxCount}`, v);
}

/** `await using results = pool.map(...)`: the map is stopped at the scope's end. */
export interface MapResults<R> extends AsyncDisposable {
  [Symbol.asyncDispose](): Promise<void>;
}

const asyncDispose = (Symbol as { readonly asyncDispose?: symbol }).asyncDispose;
if (typeof asyncDispose === "symbol") {
  Object.defineProperty(MapResults.prototype, asyncDispose, {
    value: function (this: MapResults<unknown>) {
      return this.return().then(() => undefined);
    },
    writable: true,
    configurable: true,
    enumerable: false,
  });
}

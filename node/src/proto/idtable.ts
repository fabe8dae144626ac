/**
 * A table of request ids (never 0) to values, for the requests in flight: open addressing with
 * linear probing and backward-shift deletion, so that adding and removing a request allocates
 * nothing (a Map allocates on churn: about 90 bytes per request and side here). Ids are handed
 * out in sequence, so `id & mask` spreads them evenly. The table doubles when half full and never
 * shrinks: its size is bounded by the peak number in flight, which max_in_flight bounds.
 * @module
 * @internal
 */
export class IdTable<V> {
  private keys = new Float64Array(16);
  private values: (V | undefined)[] = new Array<V | undefined>(16).fill(undefined);
  private mask = 15;
  private count = 0;

  /** Entries in the table. */
  get size(): number {
    return this.count;
  }

  private slot(id: number): number {
    const keys = this.keys;
    const mask = this.mask;
    let i = id & mask;
    for (;;) {
      const k = keys[i];
      if (k === id) return i;
      if (k === 0) return -1;
      i = (i + 1) & mask;
    }
  }

  get(id: number): V | undefined {
    const i = this.slot(id);
    return i < 0 ? undefined : this.values[i];
  }

  has(id: number): boolean {
    return this.slot(id) >= 0;
  }

  /** Adds or replaces `id`'s value. `id` must not be 0. */
  set(id: number, value: V): void {
    if ((this.count + 1) * 2 > this.keys.length) this.grow();
    const keys = this.keys;
    const mask = this.mask;
    let i = id & mask;
    for (;;) {
      const k = keys[i];
      if (k === id) {
        this.values[i] = value;
        return;
      }
      if (k === 0) {
        keys[i] = id;
        this.values[i] = value;
        this.count++;
        return;
      }
      i = (i + 1) & mask;
    }
  }

  /** Removes `id`; returns whether it was there. */
  delete(id: number): boolean {
    let i = this.slot(id);
    if (i < 0) return false;
    const keys = this.keys;
    const values = this.values;
    const mask = this.mask;
    keys[i] = 0;
    values[i] = undefined;
    this.count--;
    // Backward shift: move later entries of the probe run into the hole when their home slot
    // is not cyclically within (hole, their slot], so every entry stays reachable from home.
    let j = i;
    for (;;) {
      j = (j + 1) & mask;
      const k = keys[j];
      if (k === 0) return true;
      const home = k & mask;
      const stays = i <= j ? home > i && home <= j : home > i || home <= j;
      if (!stays) {
        keys[i] = k;
        values[i] = values[j];
        keys[j] = 0;
        values[j] = undefined;
        i = j;
      }
    }
  }

  /** The ids, ascending (the order requests started in: ids only grow). */
  ids(): number[] {
    const out: number[] = [];
    for (const k of this.keys) if (k !== 0) out.push(k);
    return out.sort((a, b) => a - b);
  }

  private grow(): void {
    const oldKeys = this.keys;
    const oldValues = this.values;
    const cap = oldKeys.length * 2;
    this.keys = new Float64Array(cap);
    this.values = new Array<V | undefined>(cap).fill(undefined);
    this.mask = cap - 1;
    this.count = 0;
    for (let i = 0; i < oldKeys.length; i++) if (oldKeys[i] !== 0) this.set(oldKeys[i], oldValues[i] as V);
  }
}

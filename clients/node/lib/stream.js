// Stream: what create({stream: true}) resolves to, as in the official package: an async iterable of
// chunk objects with an AbortController. Leaving a `for await` loop early (break, return, throw)
// or aborting the controller stops the generation behind it.

export class Stream {
  /** `iterate(signal)` is an async generator of chunks; it ends its source when `signal` aborts
   * or when the generator is returned early. */
  constructor(iterate, controller) {
    this.controller = controller;
    this._iterate = iterate;
    this._consumed = false;
  }

  [Symbol.asyncIterator]() {
    if (this._consumed) {
      throw new Error('Cannot iterate over a consumed stream, create another.');
    }
    this._consumed = true;
    return this._iterate(this.controller.signal);
  }
}

/** A queue one producer pushes into (from a C callback or a socket) and one async reader drains. */
export class ChunkQueue {
  constructor() {
    this.items = [];
    this.done = false;
    this._wake = null;
  }

  push(item) {
    this.items.push(item);
    this._notify();
  }

  finish() {
    this.done = true;
    this._notify();
  }

  _notify() {
    const w = this._wake;
    this._wake = null;
    if (w) w();
  }

  /** Resolves once an item is waiting or the queue is finished. */
  async wait() {
    while (this.items.length === 0 && !this.done) {
      await new Promise((resolve) => { this._wake = resolve; });
    }
  }

  /** The next item, or undefined once finished and drained. */
  async next() {
    await this.wait();
    return this.items.length ? this.items.shift() : undefined;
  }
}

/**
 * A schema-free parser for the protobuf text format Caffe writes its nets in (`.prototxt`). It
 * returns a generic tree that keeps field order, repeated fields and every value's line and column,
 * so the importer can point at the exact spot of a problem in the user's file.
 *
 * @module
 */

import { TandemError } from "../errors.ts";

/**
 * Malformed or unsupported prototxt, with the position of the problem (1-based line and column).
 *
 * @example
 * ```ts
 * import { parsePrototxt, PrototxtError } from "./prototxt.ts";
 * try {
 *   parsePrototxt('name: "net', "net.prototxt");
 * } catch (e) {
 *   if (e instanceof PrototxtError) console.log(e.line, e.column); // 1 7
 * }
 * ```
 */
export class PrototxtError extends TandemError {
  /** The error's message without the `file:line:column:` prefix. */
  readonly detail: string;
  /** An error at `line`:`column` of `fileName`; the message reads `file:line:column: detail`. */
  constructor(
    /** File the text came from (`<prototxt>` when not given). */
    readonly fileName: string,
    /** 1-based line. */
    readonly line: number,
    /** 1-based column. */
    readonly column: number,
    detail: string,
  ) {
    super(`${fileName}:${line}:${column}: ${detail}`);
    this.detail = detail;
  }
}

/**
 * A scalar value as written: a number, a quoted string, `true`/`false`, or an identifier (an enum
 * value such as `MAX`; the schema-free parser cannot tell enums from other identifiers).
 *
 * @example
 * ```ts
 * import type { PrototxtScalar } from "./prototxt.ts";
 * const pool: PrototxtScalar = { kind: "identifier", value: "MAX" };
 * ```
 */
export type PrototxtScalar =
  | { kind: "number"; value: number; text: string }
  | { kind: "string"; value: string }
  | { kind: "bool"; value: boolean }
  | { kind: "identifier"; value: string };

/**
 * One `name: value` or `name { … }` occurrence, with where its name starts in the file.
 *
 * @example
 * ```ts
 * import { parsePrototxt } from "./prototxt.ts";
 * const f = parsePrototxt("num_output: 96").fields[0];
 * console.log(f.name, f.line, f.column); // num_output 1 1
 * ```
 */
export interface PrototxtField {
  /** Field name. */
  readonly name: string;
  /** A scalar or a nested message. */
  readonly value: PrototxtScalar | PrototxtMessage;
  /** 1-based line of the field name. */
  readonly line: number;
  /** 1-based column of the field name. */
  readonly column: number;
  /** 1-based line of the value (for pointing at a bad value rather than its field). */
  readonly valueLine: number;
  /** 1-based column of the value. */
  readonly valueColumn: number;
}

/**
 * A message: its fields in file order (a repeated field appears once per occurrence).
 *
 * @example
 * ```ts
 * import { parsePrototxt } from "./prototxt.ts";
 * const net = parsePrototxt('layer { name: "a" } layer { name: "b" }');
 * console.log(net.all("layer").length); // 2
 * ```
 */
export class PrototxtMessage {
  /** Fields in the order they appear. */
  readonly fields: PrototxtField[] = [];
  /** A message starting at `line`:`column` (the opening brace; 1:1 for a whole file). */
  constructor(
    /** File the message was parsed from. */
    readonly fileName: string,
    /** 1-based line where the message starts. */
    readonly line: number,
    /** 1-based column where the message starts. */
    readonly column: number,
  ) {}

  /** Every occurrence of field `name`, in order. */
  all(name: string): PrototxtField[] {
    return this.fields.filter((f) => f.name === name);
  }

  /** The first occurrence of field `name`, if any. */
  first(name: string): PrototxtField | undefined {
    return this.fields.find((f) => f.name === name);
  }

  /** True when field `name` occurs at least once. */
  has(name: string): boolean {
    return this.fields.some((f) => f.name === name);
  }

  /** Distinct field names in first-appearance order. */
  names(): string[] {
    return [...new Set(this.fields.map((f) => f.name))];
  }
}

type TokenKind = "identifier" | "number" | "string" | "symbol" | "end";

interface Token {
  kind: TokenKind;
  /** Source text (for strings: the decoded value). */
  text: string;
  line: number;
  column: number;
}

// Protobuf's own number grammar: decimal, hex and octal integers, and floats with an optional
// exponent and `f` suffix (`1e-4`, `.5`, `5.`, `1.0f`).
const DECIMAL = /^(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fF]?$/;
const HEX = /^0[xX][0-9a-fA-F]+$/;
const OCTAL = /^0[0-7]+$/;

const SIMPLE_ESCAPES: Record<string, string> = {
  n: "\n",
  t: "\t",
  r: "\r",
  a: "\x07",
  b: "\b",
  f: "\f",
  v: "\v",
  "\\": "\\",
  "'": "'",
  '"': '"',
  "?": "?",
};

class Lexer {
  #pos = 0;
  #line = 1;
  #lineStart = 0;
  #peeked: Token | undefined;

  constructor(readonly text: string, readonly fileName: string) {}

  error(line: number, column: number, detail: string): never {
    throw new PrototxtError(this.fileName, line, column, detail);
  }

  peek(): Token {
    return (this.#peeked ??= this.#scan());
  }

  next(): Token {
    const token = this.peek();
    this.#peeked = undefined;
    return token;
  }

  #column(at = this.#pos): number {
    return at - this.#lineStart + 1;
  }

  #skipSpaceAndComments(): void {
    const s = this.text;
    while (this.#pos < s.length) {
      const c = s[this.#pos];
      if (c === "\n") {
        this.#pos++;
        this.#line++;
        this.#lineStart = this.#pos;
      } else if (c === " " || c === "\t" || c === "\r" || c === "\f" || c === "\v") {
        this.#pos++;
      } else if (c === "#") {
        while (this.#pos < s.length && s[this.#pos] !== "\n") this.#pos++;
      } else {
        return;
      }
    }
  }

  #scan(): Token {
    this.#skipSpaceAndComments();
    const s = this.text;
    const line = this.#line, column = this.#column();
    if (this.#pos >= s.length) return { kind: "end", text: "", line, column };
    const c = s[this.#pos];
    if (/[A-Za-z_]/.test(c)) {
      const start = this.#pos;
      while (this.#pos < s.length && /[A-Za-z0-9_]/.test(s[this.#pos])) this.#pos++;
      return { kind: "identifier", text: s.slice(start, this.#pos), line, column };
    }
    if (/[0-9.]/.test(c) || (c === "-" && /[0-9.]/.test(s[this.#pos + 1] ?? ""))) {
      const start = this.#pos;
      this.#pos++;
      // Take the whole run of number-like characters so `1.2.3` or `12abc` is reported as one bad number.
      while (this.#pos < s.length) {
        const d = s[this.#pos];
        if (/[A-Za-z0-9_.]/.test(d)) this.#pos++;
        else if (
          (d === "+" || d === "-") && /[eE]/.test(s[this.#pos - 1]) && !HEX.test(s.slice(start, this.#pos))
        ) {
          this.#pos++;
        } else break;
      }
      return { kind: "number", text: s.slice(start, this.#pos), line, column };
    }
    if (c === '"' || c === "'") return this.#string(c, line, column);
    this.#pos++;
    return { kind: "symbol", text: c, line, column };
  }

  #string(quote: string, line: number, column: number): Token {
    const s = this.text;
    this.#pos++;
    let out = "";
    while (true) {
      if (this.#pos >= s.length || s[this.#pos] === "\n") {
        this.error(
          line,
          column,
          `unterminated string: expected a closing ${quote} before the end of the line`,
        );
      }
      const c = s[this.#pos];
      if (c === quote) {
        this.#pos++;
        return { kind: "string", text: out, line, column };
      }
      if (c !== "\\") {
        out += c;
        this.#pos++;
        continue;
      }
      const escapeColumn = this.#column();
      const e = s[this.#pos + 1] ?? "";
      this.#pos += 2;
      if (e in SIMPLE_ESCAPES) {
        out += SIMPLE_ESCAPES[e];
      } else if (/[0-7]/.test(e)) {
        let digits = e;
        while (digits.length < 3 && /[0-7]/.test(s[this.#pos] ?? "")) digits += s[this.#pos++];
        out += String.fromCharCode(parseInt(digits, 8));
      } else if (e === "x" || e === "X") {
        let digits = "";
        while (digits.length < 2 && /[0-9a-fA-F]/.test(s[this.#pos] ?? "")) digits += s[this.#pos++];
        if (!digits) this.error(line, escapeColumn, "bad escape: \\x needs hex digits");
        out += String.fromCharCode(parseInt(digits, 16));
      } else if (e === "u" || e === "U") {
        const length = e === "u" ? 4 : 8;
        const digits = s.slice(this.#pos, this.#pos + length);
        if (!new RegExp(`^[0-9a-fA-F]{${length}}$`).test(digits)) {
          this.error(line, escapeColumn, `bad escape: \\${e} needs ${length} hex digits`);
        }
        const code = parseInt(digits, 16);
        if (code > 0x10ffff) this.error(line, escapeColumn, `bad escape: \\${e}${digits} is beyond Unicode`);
        out += String.fromCodePoint(code);
        this.#pos += length;
      } else {
        this.error(line, escapeColumn, `bad escape: \\${e === "\n" ? "<newline>" : e}`);
      }
    }
  }
}

function describe(token: Token): string {
  switch (token.kind) {
    case "end":
      return "the end of the file";
    case "string":
      return `string ${JSON.stringify(token.text)}`;
    case "symbol":
      return `"${token.text}"`;
    default:
      return `"${token.text}"`;
  }
}

function parseNumber(lexer: Lexer, token: Token): number {
  const negative = token.text.startsWith("-");
  const body = negative ? token.text.slice(1) : token.text;
  let value: number;
  if (HEX.test(body)) value = parseInt(body.slice(2), 16);
  else if (OCTAL.test(body)) value = parseInt(body.slice(1), 8);
  else if (DECIMAL.test(body) && body !== ".") value = Number(body.replace(/[fF]$/, ""));
  else return lexer.error(token.line, token.column, `bad number "${token.text}"`);
  return negative ? -value : value;
}

const CLOSING: Record<string, string> = { "{": "}", "<": ">" };

/**
 * How deep messages may nest. Caffe's deepest real nesting is about 4 (`layer { param { filler { … } } }`);
 * the limit keeps a hostile file from overflowing the parser's (recursive) stack.
 */
export const MAX_PROTOTXT_DEPTH = 100;

/** Opens the child message at `open` (a `{` or `<` just read), `depth` levels below the root. */
function openMessage(lexer: Lexer, open: Token, depth: number): PrototxtMessage {
  if (depth > MAX_PROTOTXT_DEPTH) {
    lexer.error(open.line, open.column, `messages nest deeper than ${MAX_PROTOTXT_DEPTH} levels`);
  }
  const child = new PrototxtMessage(lexer.fileName, open.line, open.column);
  parseMessageBody(lexer, child, CLOSING[open.text], depth);
  return child;
}

function parseScalar(lexer: Lexer): PrototxtScalar {
  const token = lexer.next();
  switch (token.kind) {
    case "number":
      return { kind: "number", value: parseNumber(lexer, token), text: token.text };
    case "string": {
      let value = token.text;
      // Adjacent literals concatenate, as in C and protobuf.
      while (lexer.peek().kind === "string") value += lexer.next().text;
      return { kind: "string", value };
    }
    case "identifier": {
      const t = token.text;
      if (t === "true" || t === "True") return { kind: "bool", value: true };
      if (t === "false" || t === "False") return { kind: "bool", value: false };
      if (/^(?:inf|infinity|nan)$/i.test(t)) {
        return { kind: "number", value: /^nan$/i.test(t) ? NaN : Infinity, text: t };
      }
      return { kind: "identifier", value: t };
    }
    case "symbol":
      if (token.text === "-") {
        // `- inf` / `-inf`: the only signed identifier protobuf accepts.
        const next = lexer.peek();
        if (next.kind === "identifier" && /^(?:inf|infinity)$/i.test(next.text)) {
          lexer.next();
          return { kind: "number", value: -Infinity, text: `-${next.text}` };
        }
      }
  }
  return lexer.error(
    token.line,
    token.column,
    `expected a value (number, string or identifier), found ${describe(token)}`,
  );
}

function parseMessageBody(
  lexer: Lexer,
  message: PrototxtMessage,
  closing: string | undefined,
  depth: number,
): void {
  while (true) {
    const token = lexer.peek();
    if (token.kind === "end") {
      if (closing === undefined) return;
      lexer.error(
        token.line,
        token.column,
        `expected "${closing}" to close the message opened at line ${message.line}, column ${message.column}, found the end of the file`,
      );
    }
    if (token.kind === "symbol" && token.text === closing) {
      lexer.next();
      return;
    }
    if (token.kind !== "identifier") {
      lexer.error(
        token.line,
        token.column,
        closing === undefined
          ? `expected a field name, found ${describe(token)}`
          : `expected a field name or "${closing}", found ${describe(token)}`,
      );
    }
    lexer.next();
    parseField(lexer, message, token, depth);
    // Fields may be separated by an optional comma or semicolon.
    const separator = lexer.peek();
    if (separator.kind === "symbol" && (separator.text === "," || separator.text === ";")) lexer.next();
  }
}

function parseField(lexer: Lexer, parent: PrototxtMessage, nameToken: Token, depth: number): void {
  let token = lexer.peek();
  const colon = token.kind === "symbol" && token.text === ":";
  if (colon) {
    lexer.next();
    token = lexer.peek();
  }
  const at = { name: nameToken.text, line: nameToken.line, column: nameToken.column };
  if (token.kind === "symbol" && token.text in CLOSING) {
    lexer.next();
    const child = openMessage(lexer, token, depth + 1);
    parent.fields.push({ ...at, value: child, valueLine: token.line, valueColumn: token.column });
    return;
  }
  if (!colon) {
    lexer.error(
      token.line,
      token.column,
      `expected ":" or "{" after field name "${nameToken.text}", found ${describe(token)}`,
    );
  }
  if (token.kind === "symbol" && token.text === "[") {
    // List shorthand for a repeated field: `dim: [1, 3, 227, 227]`.
    lexer.next();
    if (lexer.peek().kind === "symbol" && lexer.peek().text === "]") {
      lexer.next();
      return;
    }
    while (true) {
      const start = lexer.peek();
      let value: PrototxtScalar | PrototxtMessage;
      if (start.kind === "symbol" && start.text in CLOSING) {
        lexer.next();
        value = openMessage(lexer, start, depth + 1);
      } else {
        value = parseScalar(lexer);
      }
      parent.fields.push({ ...at, value, valueLine: start.line, valueColumn: start.column });
      const next = lexer.next();
      if (next.kind === "symbol" && next.text === "]") return;
      if (!(next.kind === "symbol" && next.text === ",")) {
        lexer.error(
          next.line,
          next.column,
          `expected "," or "]" in the list of "${nameToken.text}", found ${describe(next)}`,
        );
      }
    }
  }
  const value = parseScalar(lexer);
  parent.fields.push({ ...at, value, valueLine: token.line, valueColumn: token.column });
}

/**
 * Parses protobuf text format: `name: value` fields (numbers including exponents, hex and negative
 * values; single- or double-quoted strings with C escapes, adjacent ones concatenated; `true`/`false`;
 * enum identifiers), messages written `name { … }`, `name: { … }` or `name < … >`, list shorthand
 * `name: [a, b]`, optional `,`/`;` separators and `#` comments. Repeated fields keep every
 * occurrence in order. Malformed text, or messages nested deeper than {@link MAX_PROTOTXT_DEPTH},
 * throws {@link PrototxtError} with line, column and what was expected.
 *
 * @example
 * ```ts
 * import { parsePrototxt } from "./prototxt.ts";
 * const net = parsePrototxt('name: "tiny"\nlayer { name: "ip" type: "InnerProduct" }', "tiny.prototxt");
 * const layer = net.first("layer")!.value; // a PrototxtMessage
 * ```
 */
export function parsePrototxt(text: string, fileName = "<prototxt>"): PrototxtMessage {
  const lexer = new Lexer(text.startsWith("\uFEFF") ? ` ${text.slice(1)}` : text, fileName);
  const root = new PrototxtMessage(fileName, 1, 1);
  parseMessageBody(lexer, root, undefined, 0);
  return root;
}

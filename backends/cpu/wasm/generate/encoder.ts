/**
 * A small WebAssembly binary encoder: enough of the module format (types, an imported memory,
 * functions, exports) and of the instruction set (integer, float, control flow, SIMD128 and the
 * relaxed-SIMD multiply-add) for the CPU backend to generate its kernels at run time, with no
 * toolchain and no committed binaries.
 *
 * Instructions are appended to a {@link FunctionWriter} one call per opcode, in stack-machine
 * order, so generated code reads like the WebAssembly text format it stands for. Nothing here
 * checks types: `WebAssembly.validate` on the finished bytes is the checker (the tests run it on
 * every generated module).
 *
 * It stays one file although long: nearly all of it is {@link FunctionWriter}'s one short method per
 * opcode (some 120 of them), which only make sense beside the opcode table and the LEB128 encoders above
 * them; the module builder at the end is the rest.
 *
 * @module
 */

/**
 * Value types of WebAssembly, by their binary code.
 *
 * @example
 * ```ts
 * import { ValType } from "./encoder.ts";
 * console.log(ValType.v128); // 0x7b
 * ```
 */
export const ValType = {
  i32: 0x7f,
  i64: 0x7e,
  f32: 0x7d,
  f64: 0x7c,
  v128: 0x7b,
} as const;

/** One of the {@link ValType} codes. */
export type ValType = typeof ValType[keyof typeof ValType];

/**
 * Appends `value` as unsigned LEB128 (the encoding of every count, index and memory offset).
 *
 * @example
 * ```ts
 * import { unsignedLeb128 } from "./encoder.ts";
 * const out: number[] = [];
 * unsignedLeb128(out, 624485); // out is [0xe5, 0x8e, 0x26]
 * ```
 */
export function unsignedLeb128(out: number[], value: number): void {
  if (!Number.isInteger(value) || value < 0 || value > 0xffffffff) {
    throw new RangeError(`unsignedLeb128: ${value} is not a u32`);
  }
  do {
    let byte = value & 0x7f;
    value = Math.floor(value / 128);
    if (value !== 0) byte |= 0x80;
    out.push(byte);
  } while (value !== 0);
}

/**
 * Appends `value` as signed LEB128 (the encoding of `i32.const` immediates).
 *
 * @example
 * ```ts
 * import { signedLeb128 } from "./encoder.ts";
 * const out: number[] = [];
 * signedLeb128(out, -123456); // out is [0xc0, 0xbb, 0x78]
 * ```
 */
export function signedLeb128(out: number[], value: number): void {
  if (!Number.isInteger(value) || value < -0x80000000 || value > 0xffffffff) {
    throw new RangeError(`signedLeb128: ${value} is not an i32`);
  }
  value |= 0; // i32 wrap-around, so 0xffffffff encodes as −1
  for (;;) {
    const byte = value & 0x7f;
    value >>= 7;
    const signBitClear = (byte & 0x40) === 0;
    if ((value === 0 && signBitClear) || (value === -1 && !signBitClear)) {
      out.push(byte);
      return;
    }
    out.push(byte | 0x80);
  }
}

function utf8Name(out: number[], name: string): void {
  const bytes = new TextEncoder().encode(name);
  unsignedLeb128(out, bytes.length);
  for (const b of bytes) out.push(b);
}

/** Block type of a block, loop or if without results. */
const EMPTY_BLOCK = 0x40;
/** Prefix of the SIMD opcodes, each followed by its number as unsigned LEB128. */
const SIMD_PREFIX = 0xfd;
/** Prefix of the bulk-memory and saturating-truncation opcodes. */
const MISC_PREFIX = 0xfc;

/** SIMD opcode numbers (after the 0xfd prefix) of the instructions the kernels use. */
const Simd = {
  load: 0x00,
  load32Splat: 0x09,
  load64Splat: 0x0a,
  store: 0x0b,
  const: 0x0c,
  shuffle: 0x0d,
  i32x4Splat: 0x11,
  f32x4Splat: 0x13,
  f32x4ExtractLane: 0x1f,
  f32x4ReplaceLane: 0x20,
  f32x4Eq: 0x41,
  f32x4Lt: 0x43,
  f32x4Gt: 0x44,
  f32x4Le: 0x45,
  f32x4Ge: 0x46,
  not: 0x4d,
  and: 0x4e,
  andNot: 0x4f,
  or: 0x50,
  xor: 0x51,
  bitselect: 0x52,
  anyTrue: 0x53,
  load32Zero: 0x5c,
  load64Zero: 0x5d,
  store32Lane: 0x5a,
  store64Lane: 0x5b,
  i32x4AllTrue: 0xa3,
  i32x4Add: 0xae,
  i32x4Sub: 0xb1,
  i32x4Mul: 0xb5,
  i32x4ExtractLane: 0x1b,
  i32x4Eq: 0x37,
  i32x4LtS: 0x39,
  i32x4GeS: 0x3f,
  i32x4ShrU: 0xad,
  i64x2ExtmulLowI32x4U: 0xde,
  i64x2ExtmulHighI32x4U: 0xdf,
  f32x4Abs: 0xe0,
  f32x4Neg: 0xe1,
  f32x4Sqrt: 0xe3,
  f32x4Add: 0xe4,
  f32x4Sub: 0xe5,
  f32x4Mul: 0xe6,
  f32x4Div: 0xe7,
  f32x4Min: 0xe8,
  f32x4Max: 0xe9,
  f32x4Pmin: 0xea,
  f32x4Pmax: 0xeb,
  f32x4ConvertI32x4S: 0xfa,
  f64x2ExtractLane: 0x21,
  f64x2Add: 0xf0,
  f64x2PromoteLowF32x4: 0x5f,
  f64x2Splat: 0x14,
  f64x2Sqrt: 0xef,
  f64x2Sub: 0xf1,
  f64x2Mul: 0xf2,
  f64x2Div: 0xf3,
  f64x2Max: 0xf5,
  f32x4DemoteF64x2Zero: 0x5e,
  f32x4RelaxedMadd: 0x105,
  i32x4RelaxedLaneselect: 0x10b,
  f32x4RelaxedNmadd: 0x106,
} as const;

/**
 * Writes the instructions of one function body. Each method appends one instruction (its
 * immediates included) and returns `this`, so short sequences chain.
 *
 * @example
 * ```ts
 * import { FunctionWriter, ValType } from "./encoder.ts";
 * // (func (param i32 i32) (result i32) local.get 0 local.get 1 i32.add)
 * const f = new FunctionWriter([ValType.i32, ValType.i32], [ValType.i32]);
 * f.localGet(0).localGet(1).i32Add();
 * ```
 */
export class FunctionWriter {
  /** Encoded instructions so far (without the final `end`). */
  readonly code: number[] = [];
  /** Types of the declared locals that follow the parameters. */
  readonly locals: ValType[] = [];
  #depth = 0;

  /** A function with these parameter and result types. */
  constructor(readonly params: readonly ValType[], readonly results: readonly ValType[]) {}

  /** Declares a new local of type `type` and returns its index. */
  local(type: ValType): number {
    this.locals.push(type);
    return this.params.length + this.locals.length - 1;
  }

  #op(...bytes: number[]): this {
    for (const b of bytes) this.code.push(b);
    return this;
  }

  #simd(opcode: number): this {
    this.code.push(SIMD_PREFIX);
    unsignedLeb128(this.code, opcode);
    return this;
  }

  /** Memory immediate: alignment exponent and constant byte offset. */
  #memarg(alignLog2: number, offset: number): this {
    unsignedLeb128(this.code, alignLog2);
    unsignedLeb128(this.code, offset);
    return this;
  }

  // ------------------------------------------------------------ control flow

  /** `block` (no results); pair it with {@link FunctionWriter.end}. */
  block(): this {
    this.#depth++;
    return this.#op(0x02, EMPTY_BLOCK);
  }
  /** `loop` (no results); a branch to it jumps back to its start. */
  loop(): this {
    this.#depth++;
    return this.#op(0x03, EMPTY_BLOCK);
  }
  /** `if` (no results) on the i32 on the stack. */
  if(): this {
    this.#depth++;
    return this.#op(0x04, EMPTY_BLOCK);
  }
  /** `else` of the innermost `if`. */
  else(): this {
    return this.#op(0x05);
  }
  /** Ends the innermost block, loop or if. */
  end(): this {
    if (this.#depth === 0) throw new Error("FunctionWriter: end() without an open block");
    this.#depth--;
    return this.#op(0x0b);
  }
  /** `br depth`: 0 is the innermost enclosing block or loop. */
  br(depth: number): this {
    this.code.push(0x0c);
    unsignedLeb128(this.code, depth);
    return this;
  }
  /** `br_if depth` on the i32 on the stack. */
  brIf(depth: number): this {
    this.code.push(0x0d);
    unsignedLeb128(this.code, depth);
    return this;
  }
  /** `return`. */
  return(): this {
    return this.#op(0x0f);
  }
  /** `call index`. */
  call(functionIndex: number): this {
    this.code.push(0x10);
    unsignedLeb128(this.code, functionIndex);
    return this;
  }
  /** `drop`. */
  drop(): this {
    return this.#op(0x1a);
  }
  /** `select`: the first operand if the i32 on top is non-zero, else the second. */
  select(): this {
    return this.#op(0x1b);
  }

  /**
   * A counted loop `for (i = start; i < end; i += step) body()`, with `start`, `end` and `step`
   * pushed by the given callbacks (evaluated once for `start`, every iteration for `end`). Emits
   * nothing of the body when the range is empty at run time.
   */
  forRange(i: number, start: () => void, end: () => void, step: number, body: () => void): this {
    start();
    this.localSet(i);
    this.block();
    this.loop();
    this.localGet(i);
    end();
    this.i32GeS().brIf(1);
    body();
    this.localGet(i).i32Const(step).i32Add().localSet(i);
    this.br(0);
    this.end();
    this.end();
    return this;
  }

  /**
   * `acc += a·b` on the f32x4 locals `acc`, `a` and `b`: one fused `f32x4.relaxed_madd` when
   * `fused`, else a multiply then an add (`acc + a·b`, so both round as the fused path's operands).
   */
  accumulateProduct(acc: number, a: number, b: number, fused: boolean): this {
    if (fused) this.localGet(a).localGet(b).localGet(acc).f32x4RelaxedMadd();
    else this.localGet(acc).localGet(a).localGet(b).f32x4Mul().f32x4Add();
    return this.localSet(acc);
  }

  /**
   * `if (count == top) emit(top) else if … else emit(1)`: one branch per value of the i32 local
   * `count` from `top` down to 1, the last taken without a test (how macro-kernels pick the
   * micro-kernel for an edge tile's rows).
   */
  switchCount(count: number, top: number, emit: (value: number) => void): this {
    for (let r = top; r >= 1; r--) {
      if (r > 1) this.localGet(count).i32Const(r).i32Eq().if();
      emit(r);
      if (r > 1) this.else();
    }
    for (let r = top; r > 1; r--) this.end();
    return this;
  }

  // ------------------------------------------------------------ locals and constants

  /** `local.get`. */
  localGet(index: number): this {
    this.code.push(0x20);
    unsignedLeb128(this.code, index);
    return this;
  }
  /** `local.set`. */
  localSet(index: number): this {
    this.code.push(0x21);
    unsignedLeb128(this.code, index);
    return this;
  }
  /** `local.tee`. */
  localTee(index: number): this {
    this.code.push(0x22);
    unsignedLeb128(this.code, index);
    return this;
  }
  /** `i32.const`. */
  i32Const(value: number): this {
    this.code.push(0x41);
    signedLeb128(this.code, value);
    return this;
  }
  /** `f32.const` (the value rounded to float32). */
  f32Const(value: number): this {
    this.code.push(0x43);
    for (const b of new Uint8Array(new Float32Array([value]).buffer)) this.code.push(b);
    return this;
  }

  // ------------------------------------------------------------ scalar memory

  /** `i32.load offset` (4-byte aligned). */
  i32Load(offset = 0): this {
    return this.#op(0x28).#memarg(2, offset);
  }
  /** `f32.load offset` (4-byte aligned). */
  f32Load(offset = 0): this {
    return this.#op(0x2a).#memarg(2, offset);
  }
  /** `i64.load offset` (declared 4-byte aligned): moves two floats' bits unchanged. */
  i64Load(offset = 0): this {
    return this.#op(0x29).#memarg(2, offset);
  }
  /** `i64.store offset` (declared 4-byte aligned). */
  i64Store(offset = 0): this {
    return this.#op(0x37).#memarg(2, offset);
  }
  /** `i32.store offset`. */
  i32Store(offset = 0): this {
    return this.#op(0x36).#memarg(2, offset);
  }
  /** `f32.store offset`. */
  f32Store(offset = 0): this {
    return this.#op(0x38).#memarg(2, offset);
  }
  /** `memory.fill` of memory 0: (destination, byte value, length). */
  memoryFill(): this {
    return this.#op(MISC_PREFIX, 0x0b, 0x00);
  }
  /** `memory.copy` within memory 0: (destination, source, length). */
  memoryCopy(): this {
    return this.#op(MISC_PREFIX, 0x0a, 0x00, 0x00);
  }

  // ------------------------------------------------------------ i32 arithmetic

  /** `i32.eqz`. */
  i32Eqz(): this {
    return this.#op(0x45);
  }
  /** `i32.eq`. */
  i32Eq(): this {
    return this.#op(0x46);
  }
  /** `i32.ne`. */
  i32Ne(): this {
    return this.#op(0x47);
  }
  /** `i32.lt_s`. */
  i32LtS(): this {
    return this.#op(0x48);
  }
  /** `i32.gt_s`. */
  i32GtS(): this {
    return this.#op(0x4a);
  }
  /** `i32.le_s`. */
  i32LeS(): this {
    return this.#op(0x4c);
  }
  /** `i32.ge_s`. */
  i32GeS(): this {
    return this.#op(0x4e);
  }
  /** `i32.lt_u`: unsigned, so one compare also rejects negative values. */
  i32LtU(): this {
    return this.#op(0x49);
  }
  /** `i32.add`. */
  i32Add(): this {
    return this.#op(0x6a);
  }
  /** `i32.sub`. */
  i32Sub(): this {
    return this.#op(0x6b);
  }
  /** `i32.mul`. */
  i32Mul(): this {
    return this.#op(0x6c);
  }
  /** `i32.div_s`. */
  i32DivS(): this {
    return this.#op(0x6d);
  }
  /** `i32.and`. */
  i32And(): this {
    return this.#op(0x71);
  }
  /** `i32.or`. */
  i32Or(): this {
    return this.#op(0x72);
  }
  /** `i32.shl`. */
  i32Shl(): this {
    return this.#op(0x74);
  }
  /** `i32.shr_s`. */
  i32ShrS(): this {
    return this.#op(0x75);
  }
  /** `i32.rem_u`. */
  i32RemU(): this {
    return this.#op(0x70);
  }

  // ------------------------------------------------------------ f32 arithmetic

  /** `f32.gt`. */
  f32Gt(): this {
    return this.#op(0x5e);
  }
  /** `f32.le`. */
  f32Le(): this {
    return this.#op(0x5f);
  }
  /** `f32.ne`. */
  f32Ne(): this {
    return this.#op(0x5c);
  }
  /** `f32.sqrt`. */
  f32Sqrt(): this {
    return this.#op(0x91);
  }
  /** `f32.add`. */
  f32Add(): this {
    return this.#op(0x92);
  }
  /** `f32.sub`. */
  f32Sub(): this {
    return this.#op(0x93);
  }
  /** `f32.mul`. */
  f32Mul(): this {
    return this.#op(0x94);
  }
  /** `f32.div`. */
  f32Div(): this {
    return this.#op(0x95);
  }
  /** `f32.max` (IEEE: NaN wins, −0 < +0). */
  f32Max(): this {
    return this.#op(0x97);
  }
  /** `f32.convert_i32_s`. */
  f32ConvertI32S(): this {
    return this.#op(0xb2);
  }
  /** `f64.add`. */
  f64Add(): this {
    return this.#op(0xa0);
  }
  /** `f64.promote_f32`: exact. */
  f64PromoteF32(): this {
    return this.#op(0xbb);
  }
  /** `f32.demote_f64`: rounds to nearest float32. */
  f32DemoteF64(): this {
    return this.#op(0xb6);
  }

  // ------------------------------------------------------------ SIMD128

  /** `v128.load offset` (declared 4-byte aligned: packed panels are only float-aligned). */
  v128Load(offset = 0): this {
    return this.#simd(Simd.load).#memarg(2, offset);
  }
  /** `v128.store offset`. */
  v128Store(offset = 0): this {
    return this.#simd(Simd.store).#memarg(2, offset);
  }
  /** `v128.load32_splat offset`: one float broadcast to all four lanes. */
  v128Load32Splat(offset = 0): this {
    return this.#simd(Simd.load32Splat).#memarg(2, offset);
  }
  /** `v128.load64_splat offset`: one float64 (or two floats) broadcast to both 64-bit lanes. */
  v128Load64Splat(offset = 0): this {
    return this.#simd(Simd.load64Splat).#memarg(3, offset);
  }
  /** `v128.load64_zero offset`: two floats into the low lanes, zeros above. */
  v128Load64Zero(offset = 0): this {
    return this.#simd(Simd.load64Zero).#memarg(2, offset);
  }
  /** `v128.store64_lane offset lane`: stores lanes (2·lane, 2·lane + 1) as one 64-bit value. */
  v128Store64Lane(offset: number, lane: number): this {
    this.#simd(Simd.store64Lane).#memarg(2, offset);
    this.code.push(lane);
    return this;
  }
  /** `v128.const` of four float32 lanes. */
  v128ConstF32(lanes: readonly [number, number, number, number]): this {
    this.#simd(Simd.const);
    for (const b of new Uint8Array(new Float32Array(lanes).buffer)) this.code.push(b);
    return this;
  }
  /** `v128.const` of four int32 lanes. */
  v128ConstI32(lanes: readonly [number, number, number, number]): this {
    this.#simd(Simd.const);
    for (const b of new Uint8Array(new Int32Array(lanes).buffer)) this.code.push(b);
    return this;
  }
  /** `i8x16.shuffle` picking 32-bit lanes (0–3 from the first operand, 4–7 from the second). */
  shuffleF32Lanes(lanes: readonly [number, number, number, number]): this {
    this.#simd(Simd.shuffle);
    for (const lane of lanes) for (let b = 0; b < 4; b++) this.code.push(lane * 4 + b);
    return this;
  }
  /** `f32x4.splat`. */
  f32x4Splat(): this {
    return this.#simd(Simd.f32x4Splat);
  }
  /** `f64x2.promote_low_f32x4`: lanes 0 and 1 widened exactly. */
  f64x2PromoteLowF32x4(): this {
    return this.#simd(Simd.f64x2PromoteLowF32x4);
  }
  /** `f64x2.add`. */
  f64x2Add(): this {
    return this.#simd(Simd.f64x2Add);
  }
  /** `f64x2.extract_lane lane`. */
  f64x2ExtractLane(lane: number): this {
    this.#simd(Simd.f64x2ExtractLane);
    this.code.push(lane);
    return this;
  }
  /** `f64x2.splat`. */
  f64x2Splat(): this {
    return this.#simd(Simd.f64x2Splat);
  }
  /** `f64x2.sqrt` (correctly rounded, as `Math.sqrt`). */
  f64x2Sqrt(): this {
    return this.#simd(Simd.f64x2Sqrt);
  }
  /** `f64x2.sub`. */
  f64x2Sub(): this {
    return this.#simd(Simd.f64x2Sub);
  }
  /** `f64x2.mul`. */
  f64x2Mul(): this {
    return this.#simd(Simd.f64x2Mul);
  }
  /** `f64x2.div`. */
  f64x2Div(): this {
    return this.#simd(Simd.f64x2Div);
  }
  /** `f64x2.max` (IEEE: NaN wins, −0 < +0, as `Math.max`). */
  f64x2Max(): this {
    return this.#simd(Simd.f64x2Max);
  }
  /** `f32x4.demote_f64x2_zero`: both lanes rounded to nearest float32 into lanes 0–1, zeros above. */
  f32x4DemoteF64x2Zero(): this {
    return this.#simd(Simd.f32x4DemoteF64x2Zero);
  }
  /** `v128.const` of two float64 lanes. */
  v128ConstF64(lanes: readonly [number, number]): this {
    this.#simd(Simd.const);
    for (const b of new Uint8Array(new Float64Array(lanes).buffer)) this.code.push(b);
    return this;
  }
  /** `v128.load32_zero offset`: one float into lane 0, zeros above. */
  v128Load32Zero(offset = 0): this {
    return this.#simd(Simd.load32Zero).#memarg(2, offset);
  }
  /** `v128.store32_lane offset lane`: stores 32-bit lane `lane`. */
  v128Store32Lane(offset: number, lane: number): this {
    this.#simd(Simd.store32Lane).#memarg(2, offset);
    this.code.push(lane);
    return this;
  }
  /**
   * `i32x4.relaxed_laneselect`: like `v128.bitselect` where the mask's lanes are all ones or all
   * zeros (comparison results), which engines compile to one blend instruction.
   */
  i32x4RelaxedLaneselect(): this {
    return this.#simd(Simd.i32x4RelaxedLaneselect);
  }
  /** `i32x4.lt_s`: lane-wise signed `a < b`, all ones or all zeros. */
  i32x4LtS(): this {
    return this.#simd(Simd.i32x4LtS);
  }
  /** `i32x4.splat`. */
  i32x4Splat(): this {
    return this.#simd(Simd.i32x4Splat);
  }
  /** `f32x4.extract_lane lane`. */
  f32x4ExtractLane(lane: number): this {
    this.#simd(Simd.f32x4ExtractLane);
    this.code.push(lane);
    return this;
  }
  /** `f32x4.replace_lane lane`: the vector below, lane `lane` replaced by the f32 on top. */
  f32x4ReplaceLane(lane: number): this {
    this.#simd(Simd.f32x4ReplaceLane);
    this.code.push(lane);
    return this;
  }
  /** `i32x4.extract_lane lane`. */
  i32x4ExtractLane(lane: number): this {
    this.#simd(Simd.i32x4ExtractLane);
    this.code.push(lane);
    return this;
  }
  /** `f32x4.eq`. */
  f32x4Eq(): this {
    return this.#simd(Simd.f32x4Eq);
  }
  /** `f32x4.lt`. */
  f32x4Lt(): this {
    return this.#simd(Simd.f32x4Lt);
  }
  /** `f32x4.gt`. */
  f32x4Gt(): this {
    return this.#simd(Simd.f32x4Gt);
  }
  /** `f32x4.le`. */
  f32x4Le(): this {
    return this.#simd(Simd.f32x4Le);
  }
  /** `f32x4.ge`. */
  f32x4Ge(): this {
    return this.#simd(Simd.f32x4Ge);
  }
  /** `v128.not`. */
  v128Not(): this {
    return this.#simd(Simd.not);
  }
  /** `v128.and`. */
  v128And(): this {
    return this.#simd(Simd.and);
  }
  /** `v128.andnot` (first operand and not the second). */
  v128AndNot(): this {
    return this.#simd(Simd.andNot);
  }
  /** `v128.or`. */
  v128Or(): this {
    return this.#simd(Simd.or);
  }
  /** `v128.xor`. */
  v128Xor(): this {
    return this.#simd(Simd.xor);
  }
  /** `v128.bitselect` (bits of the first operand where the mask is set, else of the second). */
  v128Bitselect(): this {
    return this.#simd(Simd.bitselect);
  }
  /** `v128.any_true`. */
  v128AnyTrue(): this {
    return this.#simd(Simd.anyTrue);
  }
  /** `i32x4.add`. */
  i32x4Add(): this {
    return this.#simd(Simd.i32x4Add);
  }
  /** `i32x4.eq`. */
  i32x4Eq(): this {
    return this.#simd(Simd.i32x4Eq);
  }
  /** `i32x4.ge_s`. */
  i32x4GeS(): this {
    return this.#simd(Simd.i32x4GeS);
  }
  /** `i32x4.shr_u` (the shift count, an i32, on top of the vector). */
  i32x4ShrU(): this {
    return this.#simd(Simd.i32x4ShrU);
  }
  /** `i64x2.extmul_low_i32x4_u`: lanes 0 and 1 of each operand multiplied into two 64-bit products. */
  i64x2ExtmulLowI32x4U(): this {
    return this.#simd(Simd.i64x2ExtmulLowI32x4U);
  }
  /** `i64x2.extmul_high_i32x4_u`: the same for lanes 2 and 3. */
  i64x2ExtmulHighI32x4U(): this {
    return this.#simd(Simd.i64x2ExtmulHighI32x4U);
  }
  /** `f32x4.abs`. */
  f32x4Abs(): this {
    return this.#simd(Simd.f32x4Abs);
  }
  /** `f32x4.neg`. */
  f32x4Neg(): this {
    return this.#simd(Simd.f32x4Neg);
  }
  /** `f32x4.sqrt`. */
  f32x4Sqrt(): this {
    return this.#simd(Simd.f32x4Sqrt);
  }
  /** `f32x4.add`. */
  f32x4Add(): this {
    return this.#simd(Simd.f32x4Add);
  }
  /** `f32x4.sub`. */
  f32x4Sub(): this {
    return this.#simd(Simd.f32x4Sub);
  }
  /** `f32x4.mul`. */
  f32x4Mul(): this {
    return this.#simd(Simd.f32x4Mul);
  }
  /** `f32x4.div`. */
  f32x4Div(): this {
    return this.#simd(Simd.f32x4Div);
  }
  /** `f32x4.min` (IEEE: NaN wins, −0 < +0). */
  f32x4Min(): this {
    return this.#simd(Simd.f32x4Min);
  }
  /** `f32x4.max` (IEEE: NaN wins, −0 < +0). */
  f32x4Max(): this {
    return this.#simd(Simd.f32x4Max);
  }
  /** `f32x4.pmax`: `a < b ? b : a` per lane, like the scalar ternary. */
  f32x4Pmax(): this {
    return this.#simd(Simd.f32x4Pmax);
  }
  /** `f32x4.pmin`: `b < a ? b : a` per lane. */
  f32x4Pmin(): this {
    return this.#simd(Simd.f32x4Pmin);
  }
  /** `f32x4.convert_i32x4_s`. */
  f32x4ConvertI32x4S(): this {
    return this.#simd(Simd.f32x4ConvertI32x4S);
  }
  /**
   * `f32x4.relaxed_madd` (a·b + c, fused where the hardware has FMA): only in modules built for a
   * runtime whose relaxed-SIMD support was detected.
   */
  f32x4RelaxedMadd(): this {
    return this.#simd(Simd.f32x4RelaxedMadd);
  }
}

/** A function added to a {@link ModuleBuilder}, with the name it is exported under (if any). */
interface FunctionEntry {
  writer: FunctionWriter;
  typeIndex: number;
  exportName: string | undefined;
}

/** How the module imports its memory. */
export interface MemoryImport {
  /** Import module name. */
  module: string;
  /** Import field name. */
  name: string;
  /** Initial size in 64 KiB pages. */
  initialPages: number;
  /** Maximum size in 64 KiB pages (required for shared memories). */
  maximumPages: number;
  /** Shared between threads (a `SharedArrayBuffer` underneath). */
  shared: boolean;
}

/**
 * Assembles a module: one imported memory, functions (exported or internal) and their types.
 *
 * @example
 * ```ts
 * import { ModuleBuilder, ValType } from "./encoder.ts";
 * const builder = new ModuleBuilder();
 * builder.addFunction("add", [ValType.i32, ValType.i32], [ValType.i32], (f) => {
 *   f.localGet(0).localGet(1).i32Add();
 * });
 * const { instance } = await WebAssembly.instantiate(builder.build());
 * console.log((instance.exports.add as (a: number, b: number) => number)(2, 3)); // 5
 * ```
 */
export class ModuleBuilder {
  #types: string[] = [];
  #functions: FunctionEntry[] = [];
  #memory: MemoryImport | undefined;

  /** Imports memory 0 as described. */
  importMemory(memory: MemoryImport): this {
    this.#memory = memory;
    return this;
  }

  #typeIndex(params: readonly ValType[], results: readonly ValType[]): number {
    const key = `${params.join(",")}->${results.join(",")}`;
    let index = this.#types.indexOf(key);
    if (index < 0) {
      index = this.#types.length;
      this.#types.push(key);
    }
    return index;
  }

  /**
   * Adds a function written by `write` and returns its index (for `call`). `name` exports it;
   * `undefined` keeps it internal.
   */
  addFunction(
    name: string | undefined,
    params: readonly ValType[],
    results: readonly ValType[],
    write: (f: FunctionWriter) => void,
  ): number {
    const writer = new FunctionWriter(params, results);
    write(writer);
    this.#functions.push({ writer, typeIndex: this.#typeIndex(params, results), exportName: name });
    return this.#functions.length - 1;
  }

  /** The index the next {@link ModuleBuilder.addFunction} call will return. */
  get nextFunctionIndex(): number {
    return this.#functions.length;
  }

  /** The module's bytes. */
  build(): Uint8Array<ArrayBuffer> {
    const out: number[] = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
    const section = (id: number, body: number[]) => {
      out.push(id);
      unsignedLeb128(out, body.length);
      for (const b of body) out.push(b);
    };

    const types: number[] = [];
    unsignedLeb128(types, this.#types.length);
    for (const key of this.#types) {
      const [params, results] = key.split("->").map((s) => (s === "" ? [] : s.split(",").map(Number)));
      types.push(0x60);
      unsignedLeb128(types, params.length);
      types.push(...params);
      unsignedLeb128(types, results.length);
      types.push(...results);
    }
    section(1, types);

    if (this.#memory) {
      const m = this.#memory;
      const imports: number[] = [];
      unsignedLeb128(imports, 1);
      utf8Name(imports, m.module);
      utf8Name(imports, m.name);
      imports.push(0x02, m.shared ? 0x03 : 0x01);
      unsignedLeb128(imports, m.initialPages);
      unsignedLeb128(imports, m.maximumPages);
      section(2, imports);
    }

    const declarations: number[] = [];
    unsignedLeb128(declarations, this.#functions.length);
    for (const f of this.#functions) unsignedLeb128(declarations, f.typeIndex);
    section(3, declarations);

    const exported = this.#functions.map((f, i) => ({ f, i })).filter(({ f }) => f.exportName !== undefined);
    const exports: number[] = [];
    unsignedLeb128(exports, exported.length);
    for (const { f, i } of exported) {
      utf8Name(exports, f.exportName!);
      exports.push(0x00);
      unsignedLeb128(exports, i);
    }
    section(7, exports);

    const code: number[] = [];
    unsignedLeb128(code, this.#functions.length);
    for (const { writer } of this.#functions) {
      const body: number[] = [];
      // Locals are declared as runs of one type.
      const runs: [number, ValType][] = [];
      for (const t of writer.locals) {
        const last = runs[runs.length - 1];
        if (last && last[1] === t) last[0]++;
        else runs.push([1, t]);
      }
      unsignedLeb128(body, runs.length);
      for (const [count, type] of runs) {
        unsignedLeb128(body, count);
        body.push(type);
      }
      for (const b of writer.code) body.push(b);
      body.push(0x0b);
      unsignedLeb128(code, body.length);
      for (const b of body) code.push(b);
    }
    section(10, code);
    return new Uint8Array(out);
  }
}

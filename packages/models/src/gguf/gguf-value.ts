/**
 * GGUF metadata values: the thirteen value types a key can hold, how they are represented here,
 * and constructors for writing them. 64-bit integers are `bigint` (a file may hold values past
 * 2^53); every other number is a `number`.
 */

/** GGUF value type ids (`gguf_type`). */
export const GGUF_VALUE_TYPES = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12,
} as const;

export type GgufValueType = keyof typeof GGUF_VALUE_TYPES;
/** Every value type but ARRAY (arrays of arrays are not accepted). */
export type GgufScalarType = Exclude<GgufValueType, 'ARRAY'>;

const TYPE_BY_ID: ReadonlyMap<number, GgufValueType> = new Map(
  (Object.keys(GGUF_VALUE_TYPES) as GgufValueType[]).map((n) => [GGUF_VALUE_TYPES[n], n]),
);

/** The value type named by id `id`, or undefined for an unknown id. */
export function ggufValueTypeName(id: number): GgufValueType | undefined {
  return TYPE_BY_ID.get(id);
}

/** Bytes one element of a fixed-size type occupies; strings are variable (8-byte length + bytes). */
export const GGUF_SCALAR_BYTES: Readonly<Record<Exclude<GgufScalarType, 'STRING'>, number>> = {
  UINT8: 1,
  INT8: 1,
  UINT16: 2,
  INT16: 2,
  UINT32: 4,
  INT32: 4,
  FLOAT32: 4,
  BOOL: 1,
  UINT64: 8,
  INT64: 8,
  FLOAT64: 8,
};

/** A scalar value: number (8 to 32-bit integers, floats), bigint (64-bit integers), boolean or string. */
export type GgufScalar = number | bigint | boolean | string;

/** An array value: its element type and elements (all of that type). */
export interface GgufArray {
  readonly itemType: GgufScalarType;
  readonly items: readonly GgufScalar[];
}

/** One metadata value with its GGUF type. */
export type GgufValue =
  | { readonly type: GgufScalarType; readonly value: GgufScalar }
  | { readonly type: 'ARRAY'; readonly value: GgufArray };

/** Metadata in file order; keys are unique. */
export type GgufMetadata = ReadonlyMap<string, GgufValue>;

/** Constructors of typed values, for writing metadata. */
export const ggufValue = {
  u8: (v: number): GgufValue => ({ type: 'UINT8', value: v }),
  i8: (v: number): GgufValue => ({ type: 'INT8', value: v }),
  u16: (v: number): GgufValue => ({ type: 'UINT16', value: v }),
  i16: (v: number): GgufValue => ({ type: 'INT16', value: v }),
  u32: (v: number): GgufValue => ({ type: 'UINT32', value: v }),
  i32: (v: number): GgufValue => ({ type: 'INT32', value: v }),
  u64: (v: number | bigint): GgufValue => ({ type: 'UINT64', value: BigInt(v) }),
  i64: (v: number | bigint): GgufValue => ({ type: 'INT64', value: BigInt(v) }),
  f32: (v: number): GgufValue => ({ type: 'FLOAT32', value: v }),
  f64: (v: number): GgufValue => ({ type: 'FLOAT64', value: v }),
  bool: (v: boolean): GgufValue => ({ type: 'BOOL', value: v }),
  str: (v: string): GgufValue => ({ type: 'STRING', value: v }),
  array: (itemType: GgufScalarType, items: readonly GgufScalar[]): GgufValue => ({ type: 'ARRAY', value: { itemType, items } }),
};

/**
 * The shortest decimal that rounds to the same float32 as `x` (what Python prints for a numpy
 * float32). Metadata floats are float32, so a config's `1e-6` comes back as 9.99999997e-7; this
 * returns 1e-6 again, which is what the model's config said.
 */
export function shortestF32(x: number): number {
  if (!Number.isFinite(x) || x === 0) return x;
  const f = Math.fround(x);
  for (let p = 1; p <= 9; p++) {
    const d = Number(f.toPrecision(p));
    if (Math.fround(d) === f) return d;
  }
  return f;
}

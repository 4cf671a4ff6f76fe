import { ENGINE_OPTIONS, type OptionKind } from '@nerva/engine';
import { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { CONFIG_OPTIONS, DEFAULT_CONFIG, parseConfigTable, SERVE_DECODE_PROMPT_BUDGET, SERVER_OPTIONS } from '../src/config.js';
import { ConfigError } from '../src/errors.js';
import { addFlags, deriveFlags } from '../src/options.js';

/** A value of the wrong shape for each kind, and what the error says it must be. */
const MALFORMED: Record<OptionKind, [unknown, RegExp]> = {
  string: [3, /must be a non-empty string, got 3/],
  path: ['', /must be a non-empty string, got ""/],
  bool: ['yes', /must be true or false, got "yes"/],
  int: [-1, /must be a non-negative integer, got -1/],
  posint: [0, /must be a positive integer, got 0/],
  port: [70000, /must be a port number \(0-65535\), got 70000/],
  size: ['lots', /must be a size such as 4GiB.*got "lots"/],
  sizes: ['10GiB', /must be a list of sizes such as \["10GiB", "20GiB"\], got "10GiB"/],
  fraction: [1.5, /must be a number from 0 to 1, got 1.5/],
  choice: ['fp8', /must be "[a-z0-9]+"(, "[a-z0-9]+")* or "[a-z0-9]+", got "fp8"/],
  split: [1, /must be "auto", "off" or a fraction in \(0, 1\), got 1/],
  strings: [['a', ''], /must be a list of non-empty strings, got \["a",""\]/],
  intrange: [[3, 1], /must be two integers \[min, max\] with min <= max, got \[3,1\]/],
};

describe('the options schema', () => {
  it('names every flag and config key once', () => {
    const all = [...ENGINE_OPTIONS, ...SERVER_OPTIONS];
    const flags = all.flatMap((s) => ('flag' in s ? [s.flag.split(' ')[0]] : []));
    const keys = all.flatMap((s) => ('toml' in s ? [s.toml] : []));
    expect(new Set(flags).size).toBe(flags.length);
    expect(new Set(keys).size).toBe(keys.length);
    expect(new Set(all.map((s) => s.name)).size).toBe(all.length);
  });

  it('gives each choice option its choices, and a default only among them', () => {
    for (const s of ENGINE_OPTIONS) {
      if (s.kind !== 'choice') continue;
      expect(s.choices.length, s.name).toBeGreaterThan(1);
      if ('default' in s) expect(s.choices as readonly string[], s.name).toContain(s.default);
    }
  });

  it('the default config is the defaults of the schema', () => {
    expect(DEFAULT_CONFIG).toEqual({
      host: '127.0.0.1',
      port: 8000,
      backend: 'auto',
      enablePrefixCaching: true,
      maxQueue: 256,
      requestTimeoutS: 600,
      bodyLimitBytes: 1024 * 1024,
      drainTimeoutS: 30,
      // An engine option the server sets for its own use (the engine's default suits offline batches).
      decodePromptBudget: SERVE_DECODE_PROMPT_BUDGET,
    });
    expect(SERVE_DECODE_PROMPT_BUDGET).toBe(256);
    expect(parseConfigTable({ decode_prompt_budget: 64 }, 'nerva.toml').decodePromptBudget).toBe(64);
  });

  // One malformed config per key: the error names the key and says what it must be.
  describe.each(CONFIG_OPTIONS.map((s) => [s.toml!, s] as const))('config key %s', (key, spec) => {
    it('rejects a value of the wrong kind, naming the key', () => {
      const [bad, why] = MALFORMED[spec.kind];
      let err: unknown;
      try {
        parseConfigTable({ [key]: bad }, 'nerva.toml');
      } catch (e) {
        err = e;
      }
      expect(err, key).toBeInstanceOf(ConfigError);
      expect((err as Error).message).toContain(`nerva.toml: "${key}"`);
      expect((err as Error).message).toMatch(why);
    });
  });

  it('reads a list of sizes from TOML, and names the entry that is not one', () => {
    expect(parseConfigTable({ stage_vram_budgets: ['1GiB', 1024] }, 'nerva.toml').stageVramBudgets).toEqual([2 ** 30, 1024]);
    expect(() => parseConfigTable({ stage_vram_budgets: ['1GiB', 'lots'] }, 'nerva.toml')).toThrow(/nerva.toml: "stage_vram_budgets\[1\]" must be a size such as 4GiB/);
    expect(() => parseConfigTable({ stage_vram_budgets: [] }, 'nerva.toml')).toThrow(/must be a list of sizes/);
  });

  it('covers every config key with a case (no kind without a malformed value)', () => {
    expect(CONFIG_OPTIONS.length).toBeGreaterThan(20);
    for (const s of CONFIG_OPTIONS) expect(MALFORMED[s.kind], s.name).toBeDefined();
  });
});

describe('flags derived from the schema', () => {
  const specs = ENGINE_OPTIONS.filter((s) => ['backend', 'enablePrefixCaching', 'batchInvariant', 'vramBudget', 'pipelineParallel', 'stageVramBudgets', 'kvWarmLinkShare'].includes(s.name));
  const parse = (argv: string[], applyDefaults: boolean) => {
    const flags = deriveFlags(specs, { applyDefaults });
    const cmd = addFlags(new Command().exitOverride().configureOutput({ writeErr: () => {} }), flags);
    cmd.parse(argv, { from: 'user' });
    return flags.read(cmd.opts());
  };

  it('reads the given flags into engine option names, typed', () => {
    expect(
      parse(['--vram-budget', '4GiB', '--no-prefix-caching', '--batch-invariant', '--pipeline-parallel', '2', '--stage-vram-budgets', '1GiB, 512MiB', '--kv-warm-link-share', '0.5'], false),
    ).toEqual({
      vramBudget: 4 * 2 ** 30,
      enablePrefixCaching: false,
      batchInvariant: true,
      pipelineParallel: 2,
      stageVramBudgets: [2 ** 30, 512 * 2 ** 20],
      kvWarmLinkShare: 0.5,
    });
  });

  it('leaves absent flags out, or gives their defaults where defaults apply', () => {
    expect(parse([], false)).toEqual({});
    expect(parse([], true)).toEqual({ backend: 'auto', enablePrefixCaching: true });
  });

  it('rejects bad values with messages naming the flag', () => {
    expect(() => parse(['--pipeline-parallel', '0'], false)).toThrow('--pipeline-parallel must be a positive integer, got "0"');
    expect(() => parse(['--vram-budget', 'lots'], false)).toThrow('--vram-budget must be a size such as 4GiB');
    expect(() => parse(['--stage-vram-budgets', '1GiB,lots'], false)).toThrow('--stage-vram-budgets must be a size such as 4GiB');
    expect(() => parse(['--kv-warm-link-share', '2'], false)).toThrow('--kv-warm-link-share must be a number from 0 to 1');
    expect(() => parse(['--backend', 'tpu'], false)).toThrow(/Allowed choices are cpu, cuda, auto/);
  });
});

describe('the security flags of nerva serve', () => {
  const names = ['allowedHosts', 'maxConnections', 'allowClientPriority', 'clientPriorityRange', 'maxSequencesPerClient', 'engineWatchdogS', 'accessLog'];
  const specs = SERVER_OPTIONS.filter((s) => names.includes(s.name));

  it('are declared in the schema and read back into config fields', () => {
    expect(specs.map((s) => s.name).sort()).toEqual([...names].sort());
    const flags = deriveFlags(specs);
    const cmd = addFlags(new Command().exitOverride().configureOutput({ writeErr: () => {} }), flags);
    cmd.parse(
      [
        '--allowed-hosts',
        'a.example, b.example',
        '--max-connections',
        '8',
        '--allow-client-priority',
        '--client-priority-range',
        '-5,5',
        '--max-sequences-per-client',
        '3',
        '--engine-watchdog',
        '5',
        '--no-access-log',
      ],
      { from: 'user' },
    );
    expect(flags.read(cmd.opts())).toEqual({
      allowedHosts: ['a.example', 'b.example'],
      maxConnections: 8,
      allowClientPriority: true,
      clientPriorityRange: [-5, 5],
      maxSequencesPerClient: 3,
      engineWatchdogS: 5,
      accessLog: false,
    });
  });

  it('--client-priority-range takes MIN,MAX with MIN <= MAX, and defaults to [0, 10]', () => {
    const spec = SERVER_OPTIONS.find((s) => s.name === 'clientPriorityRange')!;
    expect(spec.default).toEqual([0, 10]);
    const parse = (v: string) => {
      const flags = deriveFlags([spec]);
      const cmd = addFlags(new Command().exitOverride().configureOutput({ writeErr: () => {} }), flags);
      cmd.parse(['--client-priority-range', v], { from: 'user' });
      return flags.read(cmd.opts());
    };
    expect(parse('2,2')).toEqual({ clientPriorityRange: [2, 2] });
    for (const bad of ['5,-5', '1', '1,2,3', 'a,b', '1.5,2', ',']) {
      expect(() => parse(bad), bad).toThrow(`--client-priority-range must be MIN,MAX (two integers, MIN <= MAX), got "${bad}"`);
    }
  });

  it('take the same values from a config file', () => {
    const table = { allowed_hosts: ['x'], engine_watchdog_s: 3, sse_buffer_bytes: '1MiB', sse_grace_s: 0, access_log: false, client_priority_range: [-2, 3], max_sequences_per_client: 4 };
    expect(parseConfigTable(table, 'nerva.toml')).toEqual({
      allowedHosts: ['x'],
      engineWatchdogS: 3,
      sseBufferBytes: 1 << 20,
      sseGraceS: 0,
      accessLog: false,
      clientPriorityRange: [-2, 3],
      maxSequencesPerClient: 4,
    });
    for (const bad of [[1], [1, 2, 3], ['0', '1'], 5, [0.5, 1]]) {
      expect(() => parseConfigTable({ client_priority_range: bad }, 'nerva.toml'), JSON.stringify(bad)).toThrow(/"client_priority_range" must be two integers \[min, max\]/);
    }
  });
});

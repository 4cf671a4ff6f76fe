import { hostname, networkInterfaces } from 'node:os';
import type { OptionSpec } from '@nerva/engine';

/** The environment variable the API key is read from when none is configured. */
export const API_KEY_ENV = 'NERVA_API_KEY';

/**
 * The server's security and robustness options: who may call it, how many connections and how
 * long they may take, and how much one request may ask for. Every field has a default a public
 * server can run with (declared below in SECURITY_OPTIONS, which config.ts SERVER_OPTIONS lists);
 * `resolveSecurity` fills them in.
 */
export interface SecurityOptions {
  /**
   * Hosts the `Host` header may name (without port). Absent: the loopback names, the bound address
   * and, when bound to a wildcard address, this machine's addresses and host name. `['*']` accepts
   * any Host (behind a reverse proxy that checks it). Guards against DNS rebinding.
   */
  allowedHosts?: string[];
  /** Open connections at most; further ones are closed at once (default 512). */
  maxConnections?: number;
  /** Seconds to receive a request's headers (default 30). */
  headersTimeoutS?: number;
  /** Seconds to receive a whole request, body included (default 60). */
  bodyTimeoutS?: number;
  /** Seconds an idle keep-alive connection stays open (default 5). */
  keepAliveTimeoutS?: number;
  /** Sequences (n × prompts) one request may hold (default: a quarter of the admission capacity). */
  maxSequencesPerRequest?: number;
  /** Tokens one request may ask for: sequences × max_tokens, max_model_len when absent (default 1,048,576). */
  maxRequestTokens?: number;
  /** Characters of prompt text (all messages, or all prompts) before tokenizing (default 262,144). */
  maxPromptChars?: number;
  /** Stop strings one request may give (default 16), each of at most `maxStopLength` characters (default 256). */
  maxStopStrings?: number;
  maxStopLength?: number;
  /** Stop token ids one request may give (default 256). */
  maxStopTokenIds?: number;
  /** Honour the request field `priority` (default false: a non-zero priority is a 400). */
  allowClientPriority?: boolean;
  /**
   * The priorities a client may set when `allowClientPriority` is on, [min, max] (default [0, 10]).
   * The scheduler orders strictly by priority (lower first, no ageing) and preempts the largest
   * value first, so a client allowed below 0 could hold back and preempt every request that sets
   * none; from 0 up, a client can only yield to others.
   */
  clientPriorityRange?: readonly [number, number];
  /**
   * Sequences one client (its address) may hold in the server at once, running and queued
   * (default: half the admission capacity), so one client cannot fill the queue.
   */
  maxSequencesPerClient?: number;
  /**
   * Bytes of SSE output buffered for a client that does not read (default 8 MiB). Past it the
   * request is aborted at once (its KV freed) and the connection closed after `sseGraceS`.
   */
  sseBufferBytes?: number;
  /** Seconds a stream stopped at `sseBufferBytes` gets to drain before its connection is closed (default 10). */
  sseGraceS?: number;
  /**
   * Seconds an engine step, a stats query or a request's first event may take before the engine
   * counts as hung (default 120): in-flight requests fail with 503, /health answers 503 and the
   * engine is restarted.
   */
  engineWatchdogS?: number;
}

export type ResolvedSecurity = Required<Omit<SecurityOptions, 'allowedHosts' | 'maxSequencesPerRequest' | 'maxSequencesPerClient'>> & {
  /** undefined: any host. */
  allowedHosts: ReadonlySet<string> | undefined;
  /** undefined: derived from the admission capacity once the engine is up. */
  maxSequencesPerRequest: number | undefined;
  maxSequencesPerClient: number | undefined;
};

/**
 * The security fields as options (flags, TOML keys, defaults), declared as the engine's are; the
 * server's SERVER_OPTIONS (config.ts) lists them after its own.
 */
export const SECURITY_OPTIONS = [
  { name: 'allowedHosts', flag: '--allowed-hosts <hosts>', toml: 'allowed_hosts', kind: 'strings', help: 'Host header values accepted besides loopback and the bound address (comma-separated; * = any)' },
  { name: 'maxConnections', flag: '--max-connections <n>', toml: 'max_connections', kind: 'posint', default: 512, help: 'open connections at most' },
  { name: 'headersTimeoutS', toml: 'headers_timeout_s', kind: 'posint', default: 30, help: "seconds to receive a request's headers" },
  { name: 'bodyTimeoutS', toml: 'body_timeout_s', kind: 'posint', default: 60, help: 'seconds to receive a whole request' },
  { name: 'keepAliveTimeoutS', toml: 'keep_alive_timeout_s', kind: 'posint', default: 5, help: 'seconds an idle keep-alive connection stays open' },
  { name: 'maxSequencesPerRequest', toml: 'max_sequences_per_request', kind: 'posint', help: 'sequences (n x prompts) one request may hold (default: a quarter of the admission capacity)' },
  { name: 'maxRequestTokens', toml: 'max_request_tokens', kind: 'posint', default: 1 << 20, help: 'tokens one request may ask for (sequences x max_tokens)' },
  { name: 'maxPromptChars', toml: 'max_prompt_chars', kind: 'posint', default: 256 * 1024, help: 'characters of prompt text before tokenizing' },
  { name: 'maxStopStrings', toml: 'max_stop_strings', kind: 'int', default: 16, help: 'stop strings one request may give' },
  { name: 'maxStopLength', toml: 'max_stop_length', kind: 'posint', default: 256, help: 'characters of one stop string' },
  { name: 'maxStopTokenIds', toml: 'max_stop_token_ids', kind: 'int', default: 256, help: 'stop token ids one request may give' },
  { name: 'allowClientPriority', flag: '--allow-client-priority', toml: 'allow_client_priority', kind: 'bool', default: false, help: "honour the request field 'priority' (else a non-zero priority is a 400)" },
  {
    name: 'clientPriorityRange',
    flag: '--client-priority-range <min,max>',
    toml: 'client_priority_range',
    kind: 'intrange',
    default: [0, 10],
    help: "the 'priority' values a client may set with --allow-client-priority (lower runs first; below 0 a client can hold back requests that set none)",
  },
  {
    name: 'maxSequencesPerClient',
    flag: '--max-sequences-per-client <n>',
    toml: 'max_sequences_per_client',
    kind: 'posint',
    help: 'sequences one client address may hold, running and queued, before 429 (default: half the admission capacity)',
  },
  { name: 'sseBufferBytes', toml: 'sse_buffer_bytes', kind: 'size', default: 8 << 20, help: 'bytes of SSE output buffered for a client that does not read; past it the request is aborted' },
  { name: 'sseGraceS', toml: 'sse_grace_s', kind: 'int', default: 10, help: 'seconds a stream aborted at sse_buffer_bytes gets to drain before its connection is closed' },
  {
    name: 'engineWatchdogS',
    flag: '--engine-watchdog <s>',
    toml: 'engine_watchdog_s',
    kind: 'posint',
    default: 120,
    help: 'seconds the engine may make no progress with work outstanding before it is restarted',
  },
] as const satisfies readonly OptionSpec<keyof SecurityOptions>[];

/** The security fields' defaults, from their option specs. */
function securityDefaults(): Record<string, unknown> {
  return Object.fromEntries(SECURITY_OPTIONS.filter((o) => 'default' in o).map((o) => [o.name, (o as { default: unknown }).default]));
}

const WILDCARDS = new Set(['0.0.0.0', '::', '']);
const LOOPBACK = ['localhost', '127.0.0.1', '::1'];

/** True when `host` (a listen address) accepts connections only from this machine. */
export function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\./.test(host);
}

/** A Host header's host part, lowercased, without port or IPv6 brackets; undefined when malformed. */
export function hostOf(header: string | undefined): string | undefined {
  if (header === undefined) return undefined;
  const h = header.trim().toLowerCase();
  if (h.startsWith('[')) {
    const end = h.indexOf(']');
    return end > 0 ? h.slice(1, end) : undefined;
  }
  const colon = h.indexOf(':');
  return colon < 0 ? h : h.slice(0, colon);
}

/** The default Host allowlist for a server bound to `listenHost`. */
export function defaultAllowedHosts(listenHost: string): Set<string> {
  const out = new Set(LOOPBACK);
  if (!WILDCARDS.has(listenHost)) out.add(listenHost.toLowerCase());
  else {
    out.add(hostname().toLowerCase());
    for (const list of Object.values(networkInterfaces())) for (const a of list ?? []) out.add(a.address.toLowerCase());
  }
  return out;
}

/** Fill in defaults; the API key falls back to $NERVA_API_KEY. */
export function resolveSecurity(o: SecurityOptions, listenHost: string): ResolvedSecurity {
  const allowed = o.allowedHosts;
  return {
    ...securityDefaults(),
    ...Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)),
    allowedHosts: allowed?.includes('*') ? undefined : new Set([...(allowed ?? []).map((h) => h.toLowerCase()), ...defaultAllowedHosts(listenHost)]),
    maxSequencesPerRequest: o.maxSequencesPerRequest,
    maxSequencesPerClient: o.maxSequencesPerClient,
  } as ResolvedSecurity;
}

/** The configured key, else the environment's (an empty variable counts as unset). */
export function apiKeyFrom(configured: string | undefined, env: NodeJS.ProcessEnv = process.env): string | undefined {
  if (configured !== undefined) return configured;
  const v = env[API_KEY_ENV];
  return v !== undefined && v.length > 0 ? v : undefined;
}

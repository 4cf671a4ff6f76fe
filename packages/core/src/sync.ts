/**
 * Every synchronization is classified. `hard`: the host waits for the device to finish;
 * `soft_visibility`: an event makes data visible to another stream without blocking the host;
 * `debug`: only in debug/profiling modes; `policy`: a host policy (stop strings, EOS, max tokens)
 * needs a token; `phase_handoff`: ownership of a block changes hands.
 */
export const SYNC_KINDS = ['hard', 'soft_visibility', 'debug', 'policy', 'phase_handoff'] as const;
export type SyncKind = (typeof SYNC_KINDS)[number];

export type SyncCounts = Record<SyncKind, number>;

export function emptySyncCounts(): SyncCounts {
  return { hard: 0, soft_visibility: 0, debug: 0, policy: 0, phase_handoff: 0 };
}

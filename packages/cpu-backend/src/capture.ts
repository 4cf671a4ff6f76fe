/**
 * What a captured graph holds: the ops and copies issued on the capturing stream, with their
 * buffers held by reference (their contents are read at replay, which is what lets per-step
 * values live in buffers) and their attributes frozen at capture time.
 */
import type { DeviceBuffer, EventHandle, OpName } from '@nerva/core';

export type GraphNode =
  | { readonly kind: 'op'; readonly op: OpName; readonly args: Readonly<Record<string, unknown>> }
  | {
      readonly kind: 'copy';
      readonly dst: DeviceBuffer;
      readonly src: DeviceBuffer;
      readonly length: number;
      readonly dstOffset: number;
      readonly srcOffset: number;
    }
  | { readonly kind: 'record'; readonly event: EventHandle };

/** Nodes the contract counts in GraphHandle.nodes: kernels and copies, not event records. */
export function countedNodes(nodes: readonly GraphNode[]): number {
  let n = 0;
  for (const node of nodes) if (node.kind !== 'record') n++;
  return n;
}

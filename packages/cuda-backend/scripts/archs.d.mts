export declare const DEFAULT_ARCHS: string[];
export declare function normalizeArch(raw: string): string;
export declare function parseArchList(value: string): string[];
export declare function selectArchitectures(
  env: Record<string, string | undefined>,
  localComputeCap: string | null,
): { archs: string[]; source: string };
export declare function gencodeFlags(archs: string[]): string[];

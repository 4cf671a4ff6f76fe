export declare const ROOT: string;
/** Shared fixtures: $NERVA_FIXTURES, else <repo root>/../shared/fixtures. */
export declare const FIXTURES: string;
export declare const MODELS: string;
export declare const DEFAULT_MODEL: string;
export declare function fixtureModels(): string[];
export interface ReferenceCase {
    prompt_ids: number[];
    greedy_f64: number[];
    step_top2_margin: number[];
    logits_tensor: string;
    top5_ids_f64: number[];
    bf16_agrees_for: number;
}

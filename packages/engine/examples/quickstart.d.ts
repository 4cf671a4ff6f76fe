/** Stream 32 sampled tokens from a model folder and return the text. */
export declare function quickstart(model: string): Promise<string>;

export { defaultModelDir, DEFAULT_MODEL_NAME } from "./default-model.js";

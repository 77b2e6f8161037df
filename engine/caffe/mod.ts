/**
 * Caffe interoperability: a protobuf text-format parser and an importer that turns Caffe net
 * definitions into Tandem networks.
 *
 * @example
 * ```ts
 * import { importCaffeNet } from "./mod.ts";
 * const { network } = importCaffeNet('input: "data" input_dim: 1 input_dim: 1 input_dim: 4 input_dim: 4 ' +
 *   'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }');
 * ```
 *
 * @module
 */

export { type CaffeImport, type CaffeImportOptions, importCaffeNet, loadCaffeNet } from "./import.ts";
export { CaffeImportError, caffeModuleName } from "./reader.ts";
export { type CaffePhase } from "./net_filter.ts";
export { type CaffeTransform } from "./data_layers.ts";
export {
  type CaffeBlob,
  type CaffeLayerWeights,
  CaffeModelError,
  loadCaffeModel,
  loadCaffeWeights,
  type LoadCaffeWeightsOptions,
  parseCaffeModel,
} from "./caffemodel.ts";
export {
  parsePrototxt,
  PrototxtError,
  type PrototxtField,
  PrototxtMessage,
  type PrototxtScalar,
} from "./prototxt.ts";

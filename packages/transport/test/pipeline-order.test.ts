import { describe, expect, it } from 'vitest';
import { pipelineDeviceOrder } from '../src/index.js';
import { loadFixture, matrix } from './helpers.js';

describe('pipelineDeviceOrder', () => {
  it('follows the best links', () => {
    expect(pipelineDeviceOrder(loadFixture('h200-nvlink-2gpu'))).toEqual([0, 1]);
    expect(pipelineDeviceOrder(loadFixture('h100-sxm-vm'))).toEqual([0]);
    // Four devices on the PCIe fixture's two GPUs is impossible; use a runtime with NVLink between 0-2 and 1-3.
    const t = loadFixture('pcie-2gpu-iommu', {
      deviceCount: 4,
      peerAccess: matrix(4, true, false),
      nvlinkLinks: [
        [0, 0, 4, 0],
        [0, 0, 0, 4],
        [4, 0, 0, 2],
        [0, 4, 2, 0],
      ],
    });
    expect(pipelineDeviceOrder(t)).toEqual([0, 2, 3, 1]);
  });
});

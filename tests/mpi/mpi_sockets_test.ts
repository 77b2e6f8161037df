/**
 * The socket mesh that carries the MPI exchange's gradients and parameters (schedule/mpi/sockets.ts):
 * its collectives against MPI's own on 3 ranks, and the order in which it offers addresses. The
 * trainer's bit-equality across processes (mpi_test.ts, mpi_overlap_test.ts) runs over it too, since
 * it is the default data plane. Each test names the deliberate bugs ("mutations") it was seen to catch.
 *
 * @module
 */

import assert from "node:assert/strict";
import { reachableAddresses } from "../../schedule/mpi/sockets.ts";
import { mpi, probeMpirun, rank0Report } from "../fixtures/mpirun.ts";

const mpirun = await probeMpirun("mpi_sockets_test");

// Mutations seen caught: Queue.push not chaining (each transfer starts at once: messages interleave
// on the stream); gather writing rank r's block at r + 1 (gathers differ from MPI's); allgather not
// copying the rank's own block; broadcast's root sending nothing (the others time out).
Deno.test({
  name:
    "mpi sockets: gather (in place or not), allgather and broadcast on 3 ranks equal MPI's, messages in posting order",
  ignore: !mpirun,
  fn: async () => {
    const run = await mpi(["tests/fixtures/socket_mesh.ts"], 90, 3);
    const checks = rank0Report<Record<string, boolean>>(run);
    assert.deepEqual(checks, {
      "gather to the last rank": true,
      "gather in place to rank 0": true,
      "allgather": true,
      "broadcast from rank 1": true,
    });
  },
});

Deno.test("mpi sockets: addresses in Open MPI's chosen subnet come first, loopback last", () => {
  // Mutation seen caught: ignoring btl_tcp_if_include (10.0.0.5 comes first).
  const interfaces = [
    { family: "IPv4", address: "127.0.0.1" },
    { family: "IPv4", address: "10.0.0.5" },
    { family: "IPv6", address: "::1" },
    { family: "IPv4", address: "192.168.7.9" },
  ] as Deno.NetworkInterfaceInfo[];
  assert.deepEqual(reachableAddresses(interfaces, "192.168.7.0/24"), [
    "192.168.7.9",
    "10.0.0.5",
    "127.0.0.1",
  ]);
  assert.deepEqual(reachableAddresses(interfaces, undefined), ["10.0.0.5", "192.168.7.9", "127.0.0.1"]);
});

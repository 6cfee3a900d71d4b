/**
 * Throughput of one connection: user A sends N messages to user B through the SDK
 * (outbox, acks), B receives them all (ordered delivery, DeliverAcks). Reports messages
 * per second (send start to last delivery) and the Node process's CPU per message
 * (process.cpuUsage, both clients in this process), median of ROUNDS runs, each on a
 * fresh server. Env: N (default 20000), ROUNDS (3), PAYLOAD bytes (100), IM_SERVER_BIN.
 */

import { connectUser, TestServer, waitFor } from "../test/support.js";

const N = Number(process.env.N ?? 20_000);
const ROUNDS = Number(process.env.ROUNDS ?? 3);
const PAYLOAD = "x".repeat(Number(process.env.PAYLOAD ?? 100));

async function round(): Promise<{ rate: number; cpuUs: number }> {
  const server = await TestServer.start({ IM_LIMITS_SEND_RATE_PER_SEC: "0" });
  try {
    const a = await connectUser(server, "bench-a", { outboxMax: N });
    const b = await connectUser(server, "bench-b");
    let got = 0;
    b.client.on("message", () => (got += 1));
    b.messages.length = 0;
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    const acks = [];
    for (let i = 0; i < N; i++) acks.push(a.client.send({ to: "bench-b" }, PAYLOAD));
    await Promise.all(acks);
    await waitFor("all delivered", () => got >= N, 300_000);
    const secs = (performance.now() - t0) / 1000;
    const cpu = process.cpuUsage(cpu0);
    await a.client.close();
    await b.client.close();
    return { rate: N / secs, cpuUs: (cpu.user + cpu.system) / N };
  } finally {
    await server.stop();
  }
}

const median = (xs: number[]): number => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)] ?? 0;

const runs: Array<{ rate: number; cpuUs: number }> = [];
for (let r = 0; r < ROUNDS; r++) {
  const res = await round();
  runs.push(res);
  console.log(`round ${r + 1}: ${res.rate.toFixed(0)} msg/s, ${res.cpuUs.toFixed(1)} us CPU/msg (sender + receiver)`);
}
console.log(
  `median of ${ROUNDS}: ${median(runs.map((x) => x.rate)).toFixed(0)} msg/s, ${median(runs.map((x) => x.cpuUs)).toFixed(1)} us CPU/msg, N=${N}, payload ${PAYLOAD.length} B`,
);
process.exit(0);

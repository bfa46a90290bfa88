// Bots for the L1 peer (bench/lobby_bench.py drives them; one process holds many members).
// Same line protocol as echo's bots (bench/lobby_bench.py `bot` role):
//   start  -> creates LOBBIES lobbies of MEMBERS members (creator + joins by id), prints
//             {"phase":"joined",...}
//   "chat RATE SECONDS"  -> RATE lines/s over this process's lobbies from a random member;
//             every other member's delivery latency is sampled; prints {"phase":"chat",...}
//   "search COUNT CONCURRENCY" -> searches (mode equality, first page), round trips sampled
//   "quit"   -> leaves every lobby and exits
// Times are wall-clock milliseconds (performance.timeOrigin + now), comparable across the
// processes of one machine.
"use strict";

const readline = require("readline");
const { Client } = require("colyseus.js");

const MODES = ["ffa", "duel", "team", "coop"];
const now = () => performance.timeOrigin + performance.now();

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}

const url = arg("url", "ws://127.0.0.1:2567");
const lobbies = Number(arg("lobbies", "10"));
const membersPer = Number(arg("members", "8"));
const offset = Number(arg("offset", "0"));
const concurrency = Number(arg("concurrency", "20"));
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

const client = new Client(url);
const rooms = []; // rooms[i] = array of Room (member 0 is the creator)
const chatLat = [];
let deliveries = 0;
let errors = 0;
let searchSeq = 0;
const pendingSearch = new Map();

function watch(room) {
  room.onMessage("chat", (m) => {
    if (m.from !== room.sessionId) {
      deliveries += 1;
      chatLat.push(now() - m.t);
    }
  });
  room.onMessage("results", (m) => {
    const done = pendingSearch.get(m.id);
    if (done) done(m);
  });
  room.onError(() => { errors += 1; });
}

async function fillLobby(i, joinLat) {
  const idx = offset + i;
  const options = { name: `lobby-${idx}`, mode: MODES[idx % MODES.length], skill: idx % 100, maxMembers: membersPer };
  let t = now();
  const owner = await client.create("lobby", options);
  joinLat.push(now() - t);
  watch(owner);
  const seats = [owner];
  for (let j = 1; j < membersPer; j++) {
    t = now();
    const room = await client.joinById(owner.roomId, {});
    joinLat.push(now() - t);
    watch(room);
    seats.push(room);
  }
  rooms[i] = seats;
}

async function joinPhase() {
  const joinLat = [];
  const t0 = now();
  let next = 0;
  async function worker() {
    while (next < lobbies) {
      const i = next++;
      try {
        await fillLobby(i, joinLat);
      } catch (e) {
        errors += 1;
        process.stderr.write(`lobby ${i}: ${e && e.message}\n`);
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(concurrency, lobbies) }, worker));
  out({ phase: "joined", joins: joinLat.length, t0, t1: now(), errors, lat: joinLat });
}

function chatPhase(rate, seconds) {
  return new Promise((resolve) => {
    chatLat.length = 0;
    deliveries = 0;
    const text = "x".repeat(32);
    const full = rooms.filter((r) => r && r.length);
    let sent = 0;
    let k = 0;
    const tick = 10;
    const t0 = now();
    const timer = setInterval(() => {
      // Catch up to the schedule: a late timer (a loaded machine) sends what is due, as the
      // echo bots' sleep_until does.
      const due = Math.floor((rate * Math.min(now() - t0, seconds * 1000)) / 1000);
      while (sent < due && full.length) {
        const seats = full[k++ % full.length];
        const sender = seats[Math.floor(Math.random() * seats.length)];
        sender.send("chat", { t: now(), text });
        sent += 1;
      }
      if (now() - t0 >= seconds * 1000) {
        clearInterval(timer);
        // Drain: lines still in flight when the sending stops.
        setTimeout(() => {
          out({ phase: "chat", sent, deliveries, expected: sent * (membersPer - 1), lat: chatLat.slice(), errors });
          resolve();
        }, 3000);
      }
    }, tick);
  });
}

async function searchPhase(count, conc) {
  const lat = [];
  let results = 0;
  let scanned = 0;
  let left = count;
  const full = rooms.filter((r) => r && r.length);
  async function worker() {
    while (left > 0) {
      left -= 1;
      const seats = full[Math.floor(Math.random() * full.length)];
      const room = seats[Math.floor(Math.random() * seats.length)];
      const id = ++searchSeq;
      const t = now();
      const reply = await new Promise((resolve) => {
        pendingSearch.set(id, resolve);
        room.send("search", { id, mode: MODES[id % MODES.length] });
      });
      pendingSearch.delete(id);
      lat.push(now() - t);
      results += reply.rooms.length;
      scanned = Math.max(scanned, reply.scanned);
    }
  }
  await Promise.all(Array.from({ length: conc }, worker));
  out({ phase: "search", n: lat.length, lat, results, scanned });
}

async function main() {
  await joinPhase();
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    const [cmd, a, b] = line.trim().split(/\s+/);
    if (cmd === "chat") await chatPhase(Number(a), Number(b));
    else if (cmd === "search") await searchPhase(Number(a), Number(b));
    else if (cmd === "quit") break;
  }
  for (const seats of rooms) for (const room of seats || []) room.leave().catch(() => {});
  setTimeout(() => process.exit(0), 500);
}

main().catch((e) => {
  process.stderr.write(`bots failed: ${e && e.stack}\n`);
  process.exit(1);
});

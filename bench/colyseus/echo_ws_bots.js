// Bots for L1-WS: echo-lobby's members on its WebSocket door (the JSON protocol,
// docs/json-protocol.md), on the same Node and the same `ws` package as Colyseus's client in
// bots.js beside it (they share this folder's pinned packages), so the two servers are
// driven by bots of the same cost. Same line protocol as bots.js and echo's Python bots
// (bench/lobby_bench.py drives them):
//   start  -> creates LOBBIES lobbies of MEMBERS members (creator + joins by id), prints
//             {"phase":"joined",...}; a join is a new connection (hello, welcome) and the join
//   "chat RATE SECONDS"  -> RATE lines/s over this process's lobbies from a random member;
//             every other member's delivery latency; prints {"phase":"chat",...}
//   "search COUNT CONCURRENCY" -> searches (mode equality, first page of 20), round trips
//   "quit"   -> closes every connection and exits
"use strict";

const crypto = require("crypto");
const readline = require("readline");
const WebSocket = require("ws");

const MODES = ["ffa", "duel", "team", "coop"];
const now = () => performance.timeOrigin + performance.now();

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}

const url = arg("url", "ws://127.0.0.1:7700");
const lobbies = Number(arg("lobbies", "10"));
const membersPer = Number(arg("members", "8"));
const offset = Number(arg("offset", "0"));
const concurrency = Number(arg("concurrency", "20"));
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

const rooms = []; // rooms[i] = array of Member (member 0 is the creator)
const chatLat = [];
let deliveries = 0;
let errors = 0;

class Member {
  constructor(name) {
    this.name = name;
    this.rid = 0;
    this.pending = new Map();
    this.lobbyId = null;
  }

  open() {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, { perMessageDeflate: false });
      this.ws = ws;
      ws.on("open", () => {
        const secret = crypto.randomBytes(16).toString("base64");
        ws.send(JSON.stringify({ type: "hello", v: 1, member_id: this.name, secret }));
      });
      ws.on("message", (data) => {
        const m = JSON.parse(data);
        if (m.type === "welcome") resolve(this);
        else this.onMessage(m);
      });
      ws.on("error", (e) => { errors += 1; reject(e); });
      ws.on("close", (code, reason) => {
        if (code !== 1000 && code !== 1005) {
          errors += 1;
          reject(new Error(`closed ${code} ${reason}`));
        }
      });
    });
  }

  onMessage(m) {
    if (m.request_id !== undefined && m.request_id !== 0 && this.pending.has(m.request_id)) {
      const done = this.pending.get(m.request_id);
      this.pending.delete(m.request_id);
      done(m);
    } else if (m.type === "chat_line" && m.member_id !== this.name) {
      deliveries += 1;
      chatLat.push(now() - Number(m.text.split(" ")[0]));
    }
  }

  request(type, fields) {
    const request_id = ++this.rid;
    return new Promise((resolve) => {
      this.pending.set(request_id, resolve);
      this.ws.send(JSON.stringify({ type, request_id, ...fields }));
    });
  }

  send(type, fields) {
    this.ws.send(JSON.stringify({ type, request_id: ++this.rid, ...fields }));
  }
}

async function seat(name, type, fields) {
  const member = await new Member(name).open();
  const reply = await member.request(type, fields);
  if (reply.type !== "lobby_joined") throw new Error(`${type}: ${JSON.stringify(reply)}`);
  member.lobbyId = reply.lobby_id;
  return member;
}

async function fillLobby(i, joinLat) {
  const idx = offset + i;
  let t = now();
  const owner = await seat(`o${idx}`, "create_lobby", {
    name: `lobby-${idx}`, max_members: membersPer, private: false,
    metadata: { mode: MODES[idx % MODES.length], skill: idx % 100 },
  });
  joinLat.push(now() - t);
  const seats = [owner];
  rooms[i] = seats;
  for (let j = 1; j < membersPer; j++) {
    t = now();
    try {
      seats.push(await seat(`m${idx}-${j}`, "join_lobby", { lobby_id: owner.lobbyId }));
      joinLat.push(now() - t);
    } catch (e) {
      errors += 1;
      process.stderr.write(`lobby ${i} member ${j}: ${e && e.message}\n`);
    }
  }
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
    const full = rooms.filter((r) => r && r.length);
    let sent = 0;
    let expected = 0;
    let k = 0;
    const t0 = now();
    const timer = setInterval(() => {
      // Catch up to the schedule, as bots.js does.
      const due = Math.floor((rate * Math.min(now() - t0, seconds * 1000)) / 1000);
      while (sent < due && full.length) {
        const seats = full[k++ % full.length];
        const sender = seats[Math.floor(Math.random() * seats.length)];
        sender.send("send_chat", { lobby_id: sender.lobbyId, text: `${now().toFixed(3)} `.padEnd(32, "x") });
        sent += 1;
        expected += seats.length - 1;
      }
      if (now() - t0 >= seconds * 1000) {
        clearInterval(timer);
        setTimeout(() => {
          out({ phase: "chat", sent, deliveries, expected, lat: chatLat.slice(), errors });
          resolve();
        }, 3000);
      }
    }, 10);
  });
}

async function searchPhase(count, conc) {
  const lat = [];
  let results = 0;
  let refused = 0;
  let left = count;
  const full = rooms.filter((r) => r && r.length);
  async function worker() {
    while (left > 0) {
      left -= 1;
      const seats = full[Math.floor(Math.random() * full.length)];
      const member = seats[Math.floor(Math.random() * seats.length)];
      const t = now();
      const reply = await member.request("search_lobbies", {
        filters: [{ kind: "string_equals", key: "mode", value: MODES[left % MODES.length] }],
        cursor: null, limit: 20,
      });
      if (reply.type !== "search_results") { refused += 1; continue; }
      lat.push(now() - t);
      results += reply.listings.length;
    }
  }
  await Promise.all(Array.from({ length: conc }, worker));
  out({ phase: "search", n: lat.length, lat, results, errors: refused });
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
  for (const seats of rooms) for (const m of seats || []) m.ws.close(1000);
  setTimeout(() => process.exit(0), 500);
}

main().catch((e) => {
  process.stderr.write(`bots failed: ${e && e.stack}\n`);
  process.exit(1);
});

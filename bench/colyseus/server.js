// The L1 peer: a room-based lobby server on Colyseus 0.16 (one process, local driver, no Redis),
// the same lobby scenario as echo-lobby: create with metadata, join by id, ready, chat to all,
// owner migration on leave, and a search over every lobby on this server with the same filter
// (string equality on "mode", paged to 20 results).
//
// Usage: node server.js PORT   (prints "listening PORT" when ready)
"use strict";

const http = require("http");
const { Server, Room, matchMaker } = require("@colyseus/core");
const { WebSocketTransport } = require("@colyseus/ws-transport");
const { Schema, MapSchema, defineTypes } = require("@colyseus/schema");

class Member extends Schema {
  constructor(id) {
    super();
    this.id = id;
    this.ready = false;
  }
}
defineTypes(Member, { id: "string", ready: "boolean" });

class LobbyState extends Schema {
  constructor() {
    super();
    this.name = "";
    this.owner = "";
    this.members = new MapSchema();
  }
}
defineTypes(LobbyState, { name: "string", owner: "string", members: { map: Member } });

const PAGE = 20;

class LobbyRoom extends Room {
  onCreate(options) {
    this.maxClients = options.maxMembers || 8;
    // A loaded machine joins slowly: keep reserved seats long enough that no join is lost.
    this.setSeatReservationTime(120);
    this.setState(new LobbyState());
    this.state.name = String(options.name || "lobby");
    this.setMetadata({ mode: String(options.mode || ""), skill: Number(options.skill || 0) });
    this.onMessage("ready", (client, message) => {
      const m = this.state.members.get(client.sessionId);
      if (m) m.ready = !!message.ready;
    });
    this.onMessage("chat", (client, message) => {
      // Chat to all members, sender included, as echo's lobby does.
      this.broadcast("chat", { from: client.sessionId, t: message.t, text: message.text });
    });
    this.onMessage("search", async (client, message) => {
      const rooms = await matchMaker.query({ name: "lobby" });
      const hits = [];
      for (const r of rooms) {
        if (r.metadata && r.metadata.mode === message.mode) {
          hits.push({ roomId: r.roomId, clients: r.clients, max: r.maxClients, skill: r.metadata.skill });
          if (hits.length >= PAGE) break;
        }
      }
      client.send("results", { id: message.id, rooms: hits, scanned: rooms.length });
    });
  }

  onJoin(client) {
    this.state.members.set(client.sessionId, new Member(client.sessionId));
    if (!this.state.owner) this.state.owner = client.sessionId;
  }

  onLeave(client) {
    this.state.members.delete(client.sessionId);
    if (this.state.owner === client.sessionId) {
      const next = this.state.members.keys().next();
      this.state.owner = next.done ? "" : next.value;
    }
  }
}

async function main() {
  const port = Number(process.argv[2] || 2567);
  const server = http.createServer();
  const gameServer = new Server({ transport: new WebSocketTransport({ server }), greet: false });
  gameServer.define("lobby", LobbyRoom);
  await gameServer.listen(port, "127.0.0.1");
  process.stdout.write(`listening ${port}\n`);
  const stop = async () => {
    await gameServer.gracefullyShutdown(false).catch(() => {});
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main().catch((error) => {
  process.stderr.write(`colyseus server failed: ${error && error.stack}\n`);
  process.exit(1);
});

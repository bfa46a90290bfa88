// Compiled by test/types.test.mjs with tsc --noEmit --strict: the declarations of lobby.js
// describe a real use of the client, and a wrong use is an error (the @ts-expect-error lines).
import { LobbyClient, LobbyError, filters, type Lobby, type LobbyEvent } from '../../lobby.js';

export async function use(url: string): Promise<string> {
  const client = await LobbyClient.connect(url, { member: 'ann', requestTimeout: 5000 });
  const id: string = await client.create('room', 4, { metadata: { mode: 'duel', level: 3 } });
  const page = await client.search([filters.equals('mode', 'duel'), filters.freeSlots(1)], { limit: 10 });
  const first: string | undefined = page.listings[0]?.lobby_id;
  const lobby: Lobby | null = client.lobby;
  const off = client.on('chat_line', (event) => console.log(event.member_id, event.text));
  off();
  for await (const event of client.events()) {
    if (event.type === 'game_starting') return `${event.address} ${event.ticket}`;
    if (event.type === 'owner_changed') console.log(event.owner);
  }
  try {
    await client.setAttributes({ colour: 'red', hat: null });
    await client.ready();
  } catch (error) {
    if (error instanceof LobbyError && error.code === 'not_owner') console.log(error.request);
  }
  // @ts-expect-error: a lobby id is a string (64-bit), never a number
  await client.join(42);
  // @ts-expect-error: no such refusal code
  const wrong: LobbyError['code'] = 'no_such_thing';
  const e: LobbyEvent = { type: 'resume_failed' };
  return `${id} ${first} ${lobby?.owner} ${wrong} ${e.type}`;
}

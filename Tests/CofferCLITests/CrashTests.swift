import CofferTestSupport
import Foundation
import Testing

/// SIGKILL a large `coffer write`: afterwards the store is consistent and the file holds exactly
/// the old or the new content.
@Suite struct CrashTests {
    /// Six of the eight rounds kill the writer while it still waits for input: it has read most
    /// of what was fed (the pipe holds only a little), so it is storing the new content, and it
    /// cannot have finished, since its input never ended. There it must die by the signal and
    /// leave the old content. The other rounds end the input and kill at a random moment after,
    /// while the last chunks are sealed or the manifest committed, or once it is done.
    /// `COFFER_CRASH_SEED` replays a run's seed.
    @Test func killedWritesLeaveOldOrNewContent() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        #expect(coffer(data, ["init", "gina"]).status == 0)
        let size = 24 << 20
        var current = pseudoRandomBytes(count: size, seed: 1)
        #expect(coffer(data, ["write", "big.bin"], stdin: current).status == 0)
        let seed =
            ProcessInfo.processInfo.environment["COFFER_CRASH_SEED"].flatMap(UInt64.init)
            ?? UInt64.random(in: 1...1_000_000)
        print("CrashTests seed \(seed) (COFFER_CRASH_SEED replays it)")
        var rng = SplitMix(seed: seed)
        let rounds = 8
        var midWrite = 0
        var interrupted = 0
        var lateKilled = 0
        for round in 0..<rounds {
            let context = "seed \(seed) round \(round)"
            let next = pseudoRandomBytes(count: size, seed: UInt64(round + 2) * 7919)
            let child = spawn(cofferBinary, ["write", "big.bin"], environment: ["COFFER_DATA_DIR": data])
            // F_GETPIPE_SZ (Linux; not exported to Swift): the pipe's capacity, which bounds what
            // it can hold unread.
            let pipeBytes = Int(fcntl(child.stdinFD, 1032))
            let killsMidWrite = round % 4 != 3
            // Mid-write: stop feeding somewhere from 1 MiB to 1 MiB short of the end.
            let feed = killsMidWrite ? (1 << 20) + rng.int(size - (2 << 20)) : size
            let fed = feedStdin(child.stdinFD, next[0..<feed])
            if killsMidWrite {
                midWrite += 1
                // The writer has taken all but what the pipe holds, and waits for the rest.
                #expect(pipeBytes > 0 && fed == feed && fed > pipeBytes, "\(context): fed \(fed) of \(feed) bytes")
                child.kill(SIGKILL)
                let r = child.wait()
                close(child.stdinFD)
                #expect(r.status == 128 + SIGKILL, "\(context): the writer was not killed mid-write: \(r.err)")
                if r.status == 128 + SIGKILL { interrupted += 1 }
            } else {
                close(child.stdinFD)
                usleep(UInt32(rng.int(1_000_000)))
                child.kill(SIGKILL)
                let r = child.wait()
                #expect(r.status == 0 || r.status == 128 + SIGKILL, "\(context): \(r.err)")
                if r.status == 128 + SIGKILL { lateKilled += 1 }
            }
            let fsck = coffer(data, ["fsck"])
            #expect(fsck.status == 0, "\(context): \(fsck.err)")
            let now = coffer(data, ["cat", "big.bin"]).stdout
            // Compared first: #expect on two 24 MiB arrays would diff them to report a failure.
            let isOld = now == current
            let isNew = now == next
            if killsMidWrite {
                #expect(isOld, "\(context): an unfinished write changed the file (\(now.count) bytes)")
            } else {
                #expect(isOld || isNew, "\(context): content is a mix (\(now.count) bytes)")
            }
            if isNew { current = next }
            if !isOld && !isNew { break }
        }
        #expect(midWrite == 6 && interrupted == midWrite, "seed \(seed): \(interrupted) of \(midWrite) kills mid-write")
        print(
            "CrashTests seed \(seed): \(interrupted) kills mid-write; after the input ended, \(lateKilled) of 2 killed")
        // Whatever interrupted writes left behind is reclaimable and the store stays clean.
        #expect(coffer(data, ["gc"]).status == 0)
        #expect(coffer(data, ["fsck"]).status == 0)
    }

    /// Writes `bytes` to a pipe, 1 MiB at a time; how many were written before it failed.
    private func feedStdin(_ fd: Int32, _ bytes: ArraySlice<UInt8>) -> Int {
        bytes.withUnsafeBytes { buf in
            var offset = 0
            while offset < buf.count, let base = buf.baseAddress {
                let n = write(fd, base + offset, min(1 << 20, buf.count - offset))
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                offset += n
            }
            return offset
        }
    }
}

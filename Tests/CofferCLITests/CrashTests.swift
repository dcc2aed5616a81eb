import CofferTestSupport
import Foundation
import Testing

/// SIGKILL a large `coffer write` at random moments: afterwards the store is consistent and the
/// file holds exactly the old or the new content.
@Suite struct CrashTests {
    @Test func killedWritesLeaveOldOrNewContent() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        #expect(coffer(data, ["init", "gina"]).status == 0)
        let size = 24 << 20
        var contents = [pseudoRandomBytes(count: size, seed: 1)]
        #expect(coffer(data, ["write", "big.bin"], stdin: contents[0]).status == 0)
        var generator = SystemRandomNumberGenerator()
        let seed = UInt64.random(in: 1...1_000_000, using: &generator)
        var rng = SplitMix(seed: seed)
        var killed = 0, completed = 0
        for round in 0..<8 {
            let next = pseudoRandomBytes(count: size, seed: UInt64(round + 2) * 7919)
            let child = spawn(cofferBinary, ["write", "big.bin"], environment: ["COFFER_DATA_DIR": data])
            let delayMicros = Int(rng.next() % 1_500_000)
            let feeder = Thread { // write the new content while the main thread waits to kill
                next.withUnsafeBytes { buf in
                    var off = 0
                    while off < buf.count {
                        let n = write(child.stdinFD, buf.baseAddress! + off, min(1 << 20, buf.count - off))
                        if n <= 0 { break }
                        off += n
                    }
                }
                close(child.stdinFD)
            }
            feeder.start()
            usleep(UInt32(delayMicros))
            child.kill(SIGKILL)
            let r = child.wait()
            if r.status == 128 + SIGKILL { killed += 1 } else { completed += 1 }
            while feeder.isExecuting { usleep(1000) }
            let fsck = coffer(data, ["fsck"])
            #expect(fsck.status == 0, "seed \(seed) round \(round): \(fsck.err)")
            let now = coffer(data, ["cat", "big.bin"]).stdout
            let matches = contents.contains(now) || now == next
            #expect(matches, "seed \(seed) round \(round): content is a mix (\(now.count) bytes)")
            if now == next { contents = [next] }
            if !matches { break }
        }
        #expect(killed + completed == 8)
        // Whatever interrupted writes left behind is reclaimable and the store stays clean.
        #expect(coffer(data, ["gc"]).status == 0)
        #expect(coffer(data, ["fsck"]).status == 0)
    }
}

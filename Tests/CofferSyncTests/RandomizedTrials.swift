import CofferModel
import CofferTestSupport
import Foundation
import Testing

@testable import CofferVault

/// Three devices doing random operations and syncs in random order. Each trial is seeded and
/// reproducible (the seed is in every failure message); at the end all trees are equal, every
/// store's fsck is clean and nothing is pending. COFFER_TRIALS sets the number of seeds,
/// COFFER_TRIAL_SEED runs one.
@Suite(.serialized) struct RandomizedTrials {
    typealias RNG = SplitMix

    static let names = ["a", "b", "c.txt", "d.txt", "e.bin"]

    func randomPath(_ d: Device, _ rng: inout RNG, folders: Bool) -> String? {
        guard let snap = try? d.snapshot() else { return nil }
        let candidates = snap.filter { !folders || $0.value.hasPrefix("folder") }.keys.sorted()
        if candidates.isEmpty { return folders ? "" : nil }
        if folders && rng.int(3) == 0 { return "" }
        return rng.pick(candidates)
    }

    static let verbose = ProcessInfo.processInfo.environment["COFFER_TRIAL_VERBOSE"] != nil

    /// What one random operation came to: nothing to act on, done, or refused (a name taken,
    /// a folder moved into itself: the trials pick paths blindly, so some refusals are normal).
    enum Outcome { case skipped, succeeded, failed }

    func randomOperation(_ d: Device, _ rng: inout RNG) -> Outcome {
        let op = rng.int(10)
        let folder = randomPath(d, &rng, folders: true) ?? ""
        let target = folder + "/" + rng.pick(Self.names)
        if Self.verbose {
            print("\(d.name): op \(op) target \(target) tree \((try? d.snapshot().keys.sorted()) ?? [])")
        }
        func attempt(_ body: () throws -> Void) -> Outcome {
            do {
                try body()
                return .succeeded
            } catch {
                if Self.verbose { print("\(d.name): op \(op) refused: \(error)") }
                return .failed
            }
        }
        switch op {
        case 0, 1:
            return attempt { try d.write(target, (0..<rng.int(6)).map { "line \($0) \(rng.int(4))\n" }.joined()) }
        case 2:
            guard let p = randomPath(d, &rng, folders: false), (try? d.vault.resolve(p).type) == .document else {
                return .skipped
            }
            return attempt {
                var lines = try d.read(p).split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
                lines.insert("edit \(rng.int(100))", at: rng.int(lines.count + 1))
                try d.write(p, lines.joined(separator: "\n"))
            }
        case 3:
            return attempt { try d.mkdir(target) }
        case 4, 5:
            guard let p = randomPath(d, &rng, folders: false) else { return .skipped }
            return attempt { try d.mv(p, target) }
        case 6:
            guard let p = randomPath(d, &rng, folders: false) else { return .skipped }
            return attempt { try d.rm(p) }
        case 7:
            guard let p = randomPath(d, &rng, folders: false) else { return .skipped }
            return attempt { try d.chmod(p, [0o600, 0o644, 0o755][rng.int(3)]) }
        case 8:
            guard let p = randomPath(d, &rng, folders: false) else { return .skipped }
            return attempt { try d.setXattr(p, "user.k\(rng.int(2))", rng.int(3) == 0 ? nil : "v\(rng.int(9))") }
        default:
            return attempt { try d.write(target, (0..<4).map { _ in UInt8(truncatingIfNeeded: rng.next()) }) }
        }
    }

    /// Operations tried (not skipped) and done, over one trial or all of them.
    struct Tally {
        var tried = 0
        var done = 0
        mutating func add(_ outcome: Outcome) {
            if outcome != .skipped { tried += 1 }
            if outcome == .succeeded { done += 1 }
        }
    }

    /// One seeded trial; what its operations came to.
    @discardableResult
    func trial(seed: UInt64, server: ServerProcess) async throws -> Tally {
        var rng = RNG(seed: seed)
        var tally = Tally()
        let w = try await SyncWorld(devices: 3, server: server)
        for _ in 0..<(20 + rng.int(20)) {
            let d = w.devices[rng.int(3)]
            if rng.int(4) == 0 {
                if Self.verbose { print("\(d.name): sync") }
                do { try await d.sync() } catch {
                    Issue.record("seed \(seed): sync of \(d.name) failed: \(error)")
                    return tally
                }
            } else {
                tally.add(randomOperation(d, &rng))
            }
        }
        for round in 0..<3 {
            for d in w.devices {
                do { try await d.sync() } catch {
                    Issue.record("seed \(seed): final sync \(round + 1) of \(d.name) failed: \(error)")
                    return tally
                }
            }
        }
        // Refusals are expected now and then, but a trial whose operations mostly fail, or that
        // ends with nothing in the tree, tests convergence of next to nothing.
        #expect(tally.done * 2 > tally.tried, "seed \(seed): only \(tally.done) of \(tally.tried) operations succeeded")
        let first = try w.devices[0].snapshot()
        #expect(!first.isEmpty, "seed \(seed): the trees converged empty")
        for d in w.devices {
            let snap = try d.snapshot()
            #expect(snap == first, "seed \(seed): device \(d.name) differs: \(SyncWorld.diff(first, snap))")
            if snap != first && Self.verbose {
                for k in Set(snap.keys).symmetricDifference(first.keys) {
                    for dev in w.devices {
                        if let n = try? dev.vault.resolve(k) {
                            let local = try dev.vault.store.read { try $0.file(n.id, .local) }
                            let base = try dev.vault.store.read { try $0.file(n.id, .base) }
                            let record = base.map {
                                "v\($0.version) del=\($0.metadata.isDeleted) sdel=\($0.serverDeleted)"
                                    + " parent=\($0.metadata.parent)"
                            }
                            print("\(dev.name) has \(k) id \(n.id) local=\(local != nil) base=\(record ?? "nil")")
                        }
                    }
                }
            }
            let report = try d.vault.check()
            #expect(report.isClean, "seed \(seed): device \(d.name) fsck: \(report.problems)")
            #expect(d.pending == 0, "seed \(seed): device \(d.name) has pending changes")
        }
        return tally
    }

    @Test func randomOperationsOnThreeDevicesConverge() async throws {
        let env = ProcessInfo.processInfo.environment
        let tmp = TemporaryDirectory("coffer-trials")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"))
        let seeds: [UInt64]
        if let one = env["COFFER_TRIAL_SEED"].flatMap(UInt64.init) {
            seeds = [one]
        } else {
            let count = env["COFFER_TRIALS"].flatMap(Int.init) ?? 200
            seeds = (1...UInt64(count)).map { $0 &* 7919 }
        }
        var total = Tally()
        for (i, seed) in seeds.enumerated() {
            let tally = try await trial(seed: seed, server: server)
            total.tried += tally.tried
            total.done += tally.done
            // The server's own validation, every 25 trials (it audits every account so far).
            if i % 25 == 24 || i == seeds.count - 1 {
                let audit = server.audit()
                #expect(audit.status == 0, "server audit after seed \(seed): \(audit.out)")
            }
        }
        print("randomized trials: \(seeds.count) seeds, \(total.done) of \(total.tried) operations succeeded")
    }
}

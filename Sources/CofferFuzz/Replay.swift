#if !COFFER_FUZZING
    import Foundation

    /// Without libFuzzer (the normal build): replays corpus files through the same targets, so the
    /// corpus is a regression test anywhere, and writes the seed corpus.
    ///
    ///     CofferFuzz TARGET FILE|DIR...     every file given (a directory: the files in it)
    ///     CofferFuzz --all CORPUS           CORPUS/<target>/* for every target
    ///     CofferFuzz --seed CORPUS          writes the generated seeds into CORPUS/<target>/
    @main
    struct Replay {
        static func main() {
            var args = Array(CommandLine.arguments.dropFirst())
            guard args.count >= 2 else { usage() }
            let first = args.removeFirst()
            switch first {
            case "--all":
                var total = 0
                for target in FuzzTarget.allCases {
                    let dir = URL(fileURLWithPath: args[0]).appendingPathComponent(target.rawValue).path
                    total += replay(target, paths: [dir])
                }
                print("coffer-fuzz: \(total) inputs replayed through \(FuzzTarget.allCases.count) targets")
            case "--seed":
                let written = Seeds.write(into: args[0])
                print("coffer-fuzz: wrote \(written) seed files under \(args[0])")
            default:
                guard let target = FuzzTarget(rawValue: first) else { usage() }
                print("coffer-fuzz: \(replay(target, paths: args)) inputs replayed through \(target.rawValue)")
            }
        }

        static func replay(_ target: FuzzTarget, paths: [String]) -> Int {
            var count = 0
            for path in paths {
                var isDirectory: ObjCBool = false
                guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else { continue }
                let files =
                    isDirectory.boolValue
                    ? ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).sorted().map {
                        path + "/" + $0
                    }
                    : [path]
                for file in files {
                    guard let data = FileManager.default.contents(atPath: file) else { continue }
                    currentInput = file
                    target.run([UInt8](data))
                    count += 1
                }
            }
            return count
        }

        static func usage() -> Never {
            let names = FuzzTarget.allCases.map(\.rawValue).joined(separator: " ")
            FileHandle.standardError.write(
                Data(
                    """
                    usage: CofferFuzz TARGET FILE|DIR...   (replay)
                           CofferFuzz --all CORPUS         (replay CORPUS/<target>/ for every target)
                           CofferFuzz --seed CORPUS        (write the seed corpus)
                    targets: \(names)

                    """.utf8))
            exit(2)
        }
    }
#endif

from orkpack.cli import main

main()

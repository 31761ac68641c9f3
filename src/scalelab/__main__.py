from scalelab.cli import main

main()

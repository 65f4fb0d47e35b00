from spamnb._entry import main

main()
